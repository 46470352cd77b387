"""Leaner DBOS step checkpoints (DBOS 3.4.0 only): the same rows and checks with less Python.

A stock DBOS async step on SQLite costs ~3 ms of CPU here, nearly all of it SQLAlchemy building and
cache-keying the same statements again for every step, plus three thread hops (one of which only
fetches a function). This module, for the unsharded SQLite and PostgreSQL system databases:

- `check_operation_execution`: DBOS's two SELECTs (status, then output) as one LEFT JOIN, compiled
  once; the same exceptions (cancelled, unexpected step name, unknown workflow).
- `record_operation_result`: DBOS's owner-token fence (an UPDATE on SQLite, FOR NO KEY UPDATE on
  PostgreSQL) and its INSERT .. ON CONFLICT .. RETURNING, compiled once from DBOS's own statements;
  the same transaction, retries and errors. Calls it does not mirror (child workflows, shard keys)
  go to DBOS's own method.
- On SQLite both run on the pooled sqlite3 connection itself; on PostgreSQL through SQLAlchemy's
  `Connection.exec_driver_sql`, which keeps its error wrapping and connection invalidation (what
  DBOS's `db_retry` relies on to ride out an outage).
- On SQLite a step's lookup and record stages (`invoke_step`'s `check_existing_result`,
  `record_step_result`) run on the event loop instead of in a worker thread: each is ~0.05-0.1 ms of
  local I/O, less than the hop to a thread and back costs. PostgreSQL (network round trips), and
  every other stage, keep DBOS's hop.
- `Pending.then` (all databases): the same stage without the hop to a thread that only returned
  the next function.

`install()` patches only when the DBOS version and the source of every function mirrored here are
the ones reviewed (`PINNED`); otherwise DBOS runs unpatched (correct, slower) and
tests/test_dbos_fastpath.py fails until someone re-reviews. Facts: docs/notes/dbos-service.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import inspect
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import sqlalchemy as sa
from dbos import _core, _dbos, _outcome, _sys_db, _sys_db_postgres, _sys_db_sqlite
from dbos._context import current_owner_xid, get_local_dbos_context
from dbos._debug_trigger import DebugTriggers
from dbos._error import (
    DBOSStepNondeterminismError,
    DBOSUnexpectedStepError,
    DBOSWorkflowCancelledError,
    DBOSWorkflowConflictIDError,
)
from dbos._shard_keys import bound_shard_key
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

DBOS_VERSION = "3.4.0"
_Base = _sys_db.SystemDatabase
_SQLite = _sys_db_sqlite.SQLiteSystemDatabase
_Postgres = _sys_db_postgres.PostgresSystemDatabase
_MIRRORED: dict[str, Any] = {
    "SystemDatabase.check_operation_execution": _Base.check_operation_execution,
    "SystemDatabase._check_operation_execution_txn": _Base._check_operation_execution_txn,
    "SystemDatabase.record_operation_result": _Base.record_operation_result,
    "SystemDatabase._record_operation_result_txn": _Base._record_operation_result_txn,
    "SystemDatabase._check_owner_txn": _Base._check_owner_txn,
    "SystemDatabase._own_key": _Base._own_key,
    "SystemDatabase._wf": _Base._wf,
    "SystemDatabase._wf_values": _Base._wf_values,
    "SystemDatabase._child_values": _Base._child_values,
    "SystemDatabase._key_column": _Base._key_column,
    "SystemDatabase._key_conflict": _Base._key_conflict,
    "SystemDatabase._now_ms_sql": _Base._now_ms_sql,
    "SQLiteSystemDatabase": _SQLite,
    "PostgresSystemDatabase": _Postgres,
    "Pending._wrap": _outcome.Pending._wrap,
    "Pending.then": _outcome.Pending.then,
    "Pending._intercept": _outcome.Pending._intercept,
    "Pending.intercept": _outcome.Pending.intercept,
    "invoke_step": _core.invoke_step,
}
# sha256 of inspect.getsource(...) of each, as reviewed for DBOS 3.4.0
PINNED = {
    "SystemDatabase.check_operation_execution": "ab119f8c55582f82",
    "SystemDatabase._check_operation_execution_txn": "766d41e9fedd809e",
    "SystemDatabase.record_operation_result": "4c94546a403b202a",
    "SystemDatabase._record_operation_result_txn": "c3ddd7275cd9a49b",
    "SystemDatabase._check_owner_txn": "5cea51935d85ccd6",
    "SystemDatabase._own_key": "ddcb070fde5e8b8f",
    "SystemDatabase._wf": "52241343bd49e908",
    "SystemDatabase._wf_values": "253d217618fbf3a8",
    "SystemDatabase._child_values": "c2d5ebd5fbfcc988",
    "SystemDatabase._key_column": "89f6ce11b5d4da22",
    "SystemDatabase._key_conflict": "fb289b4cef8ccd74",
    "SystemDatabase._now_ms_sql": "5c53016d81240b7a",
    "SQLiteSystemDatabase": "28df59d4023f86f3",
    "PostgresSystemDatabase": "39766ad041eebc83",
    "Pending._wrap": "ed2dee2ae3a28d04",
    "Pending.then": "324fb52640af6721",
    "Pending._intercept": "68d426af693b07de",
    "Pending.intercept": "14227a028b8ed367",
    "invoke_step": "f60e7b0bb683cf4f",
}
_STOCK = {"check": _Base.check_operation_execution, "record": _Base.record_operation_result,
          "then": _outcome.Pending.then, "intercept": _outcome.Pending.__dict__["_intercept"]}
# the two stages of a DBOS step that only touch the system database (see invoke_step)
_STEP_LOOKUP = "invoke_step.<locals>.check_existing_result"
_STEP_RECORD = "invoke_step.<locals>.record_step_result"


def fingerprints() -> dict[str, str]:
    """sha256 of the installed DBOS source of every function this module mirrors."""
    def digest(obj: Any) -> str:
        try:
            return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]
        except (OSError, TypeError):  # no source shipped: not what was reviewed
            return "no source"

    return {name: digest(obj) for name, obj in _MIRRORED.items()}


def mismatches() -> list[str]:
    """What differs from the reviewed DBOS (empty: the fast path may be installed)."""
    version = importlib.metadata.version("dbos")
    out = [] if version == DBOS_VERSION else [f"dbos {version} (reviewed: {DBOS_VERSION})"]
    found = fingerprints()
    return out + [name for name, digest in PINNED.items() if found.get(name) != digest]


def install() -> bool:
    """Patch DBOS (idempotent); False, and DBOS left as it is, when it is not the reviewed DBOS."""
    if _SQLite.__dict__.get("record_operation_result") is _record_operation_result:
        return True
    changed = mismatches()
    if changed:
        log.warning("DBOS differs from the reviewed %s (%s): step checkpoints take DBOS's slower path",
                    DBOS_VERSION, ", ".join(changed))
        return False
    for cls in (_SQLite, _Postgres):
        cls.check_operation_execution = _check_operation_execution  # type: ignore[method-assign]
        cls.record_operation_result = _record_operation_result  # type: ignore[method-assign]
    _outcome.Pending.then = _then  # type: ignore[method-assign]
    _outcome.Pending._intercept = staticmethod(_intercept)  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    """DBOS as shipped again (tests comparing the two)."""
    for cls in (_SQLite, _Postgres):
        for name in ("check_operation_execution", "record_operation_result"):
            if name in cls.__dict__:
                delattr(cls, name)
    _outcome.Pending.then = _STOCK["then"]  # type: ignore[method-assign]
    _outcome.Pending._intercept = _STOCK["intercept"]  # type: ignore[method-assign]


# -- the statements, compiled once per system database -----------------------------------------


class _Prepared(NamedTuple):
    sql: str
    order: tuple[str, ...]  # bind names in the driver's positional order (SQLite); empty: named (psycopg)
    names: tuple[str, ...]  # every bind name
    constants: dict[str, Any]  # the statement's own literals (e.g. strftime's arguments)

    def params(self, values: dict[str, Any]) -> Any:
        def value(k: str) -> Any:
            return values[k] if k in values else self.constants[k]

        if self.order:
            return tuple(value(k) for k in self.order)
        return {k: value(k) for k in self.names}


class _Statements(NamedTuple):
    check: _Prepared
    owner: _Prepared
    insert: _Prepared


class _NotPreparable(Exception):
    """A bind the driver would convert: DBOS's own method then runs, not this module's."""


def _prepare(sys_db: Any, stmt: Any) -> _Prepared:
    dialect = sys_db.engine.dialect
    translate = sys_db.engine.get_execution_options().get("schema_translate_map")
    compiled = stmt.compile(dialect=dialect, schema_translate_map=translate, render_schema_translate=True)
    for bind in compiled.binds.values():  # these columns' types must convert nothing on the way in
        if bind.type.dialect_impl(dialect).bind_processor(dialect) is not None:
            raise _NotPreparable(bind.key)
    order = tuple(compiled.positiontup or ())
    constants = {name: bind.value for name, bind in compiled.binds.items() if not bind.required}
    return _Prepared(str(compiled), order, tuple(compiled.binds), constants)


def _statements(sys_db: Any) -> _Statements | None:
    """DBOS's step statements compiled for this system database, once; None: leave them to DBOS."""
    if "_tether_statements" in sys_db.__dict__:
        return sys_db.__dict__["_tether_statements"]
    ws, oo = sys_db.tables.workflow_status, sys_db.tables.operation_outputs
    on = sa.and_(oo.c.workflow_uuid == ws.c.workflow_uuid, oo.c.function_id == sa.bindparam("fid", required=True))
    check = sa.select(ws.c.status, oo.c.output, oo.c.error, oo.c.function_name, oo.c.child_workflow_id,
                      oo.c.serialization, oo.c.function_id).select_from(ws.outerjoin(oo, on)).where(
        ws.c.workflow_uuid == sa.bindparam("wid", required=True))
    wid = ws.c.workflow_uuid == sa.bindparam("wid", required=True)
    if isinstance(sys_db, _SQLite):  # DBOS's `_check_owner_txn`: a write on SQLite, so it takes the lock
        owner = sa.update(ws).where(wid).values(owner_xid=ws.c.owner_xid).returning(ws.c.owner_xid)
    else:  # FOR NO KEY UPDATE
        owner = sa.select(ws.c.owner_xid).where(wid).with_for_update(key_share=True)
    columns = ("workflow_uuid", "function_id", "function_name", "started_at_epoch_ms", "completed_at_epoch_ms",
               "output", "error", "child_workflow_id", "serialization", "application_name")
    insert = (sys_db.dialect.insert(oo)
              .values(**{c: sa.bindparam(c, required=True) for c in columns},
                      retention_timestamp=sys_db._now_ms_sql())
              .on_conflict_do_update(index_elements=["workflow_uuid", "function_id"],
                                     set_={"completed_at_epoch_ms": oo.c.completed_at_epoch_ms})
              .returning(oo.c.completed_at_epoch_ms))
    try:
        made: _Statements | None = _Statements(_prepare(sys_db, check), _prepare(sys_db, owner),
                                               _prepare(sys_db, insert))
    except _NotPreparable as exc:
        log.warning("DBOS step checkpoints take DBOS's own path on this database (bind %s converts)", exc)
        made = None
    setattr(sys_db, "_tether_statements", made)  # noqa: B010 - an attribute DBOS does not declare
    return made


def _plain(workflow_id: str) -> bool:
    """No shard key in play (DBOS's own method then raises, or routes, as it should)."""
    ctx = get_local_dbos_context()
    own = ctx.shard_key if ctx is not None and ctx.workflow_id == workflow_id else None
    return own is None and bound_shard_key(workflow_id) is None


# -- running them ------------------------------------------------------------------------------
# SQLite: on the pooled sqlite3 connection itself (SQLAlchemy's result machinery costs more than a local
# read). PostgreSQL: through SQLAlchemy's Connection, which wraps driver errors as DBAPIError and
# invalidates broken connections, so DBOS's db_retry rides out an outage as it does for its own calls.


def _rows(sys_db: Any, prepared: _Prepared, values: dict[str, Any]) -> list[tuple[Any, ...]]:
    """One read."""
    if isinstance(sys_db, _SQLite):
        conn = sys_db.engine.raw_connection()
        try:
            return conn.cursor().execute(prepared.sql, prepared.params(values)).fetchall()
        finally:
            conn.close()
    # one statement: no transaction around it (BEGIN and ROLLBACK would be two more round trips)
    with sys_db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        return [tuple(r) for r in c.exec_driver_sql(prepared.sql, prepared.params(values)).all()]


@contextmanager
def _transaction(sys_db: Any) -> Iterator[Callable[[_Prepared, dict[str, Any]], list[Any]]]:
    """A write transaction; yields `run(statement, values) -> rows`. Committed if the block returns."""
    if not isinstance(sys_db, _SQLite):
        with sys_db.engine.begin() as c:
            yield lambda p, values: list(c.exec_driver_sql(p.sql, p.params(values)).fetchall())
        return
    conn = sys_db.engine.raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("BEGIN IMMEDIATE")  # what engine.begin() gets from make_engine's isolation level
        yield lambda p, values: cursor.execute(p.sql, p.params(values)).fetchall()
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


def _unique_violation(sys_db: Any, exc: Exception) -> bool:
    """DBOS's `_is_unique_constraint_violation`, also for the unwrapped sqlite3 error."""
    if isinstance(exc, sqlite3.IntegrityError):
        return "UNIQUE constraint failed" in str(exc)
    return isinstance(exc, DBAPIError) and sys_db._is_unique_constraint_violation(exc)


# -- the patched methods -----------------------------------------------------------------------


@_sys_db.db_retry()
def _check_operation_execution(self: Any, workflow_id: str, function_id: int, function_name: str, *,
                               owner_key: str | None = None) -> Any:
    sql = _statements(self)
    if sql is None or owner_key is not None or not _plain(workflow_id):
        return _STOCK["check"].__wrapped__(self, workflow_id, function_id, function_name, owner_key=owner_key)
    rows = _rows(self, sql.check, {"wid": workflow_id, "fid": function_id})
    assert len(rows) > 0, f"Error: Workflow {workflow_id} does not exist"
    status, output, error, recorded_name, child_workflow_id, serialization, found = rows[0]
    if status == _sys_db.WorkflowStatusString.CANCELLED.value:
        raise DBOSWorkflowCancelledError(f"Workflow {workflow_id} is cancelled. Aborting function.")
    if found is None:
        return None
    if function_name != recorded_name:
        raise DBOSUnexpectedStepError(workflow_id=workflow_id, step_id=function_id, expected_name=function_name,
                                      recorded_name=recorded_name)
    return {"output": output, "error": error, "serialization": serialization,
            "child_workflow_id": child_workflow_id, "child_shard_key": None}


def _record_operation_result(self: Any, result: Any, *, completed_at_epoch_ms: int | None = None,
                             owner_xid: str | None = None, owner_key: str | None = None) -> None:
    workflow_id = result["workflow_uuid"]
    sql = _statements(self)
    if sql is None or owner_key is not None or result["child_workflow_id"] is not None or not _plain(workflow_id):
        return _STOCK["record"](self, result, completed_at_epoch_ms=completed_at_epoch_ms, owner_xid=owner_xid,
                                owner_key=owner_key)
    assert result["error"] is None or result["output"] is None, "Only one of error or output can be set"
    completed_at = completed_at_epoch_ms if completed_at_epoch_ms is not None else int(time.time() * 1000)
    values = {k: result[k] for k in ("workflow_uuid", "function_id", "function_name", "started_at_epoch_ms",
                                     "output", "error", "child_workflow_id", "serialization")}
    values.update(completed_at_epoch_ms=completed_at, application_name=self.app_name)

    @_sys_db.db_retry(sys_db=self)
    def write() -> None:
        owner = owner_xid if owner_xid is not None else current_owner_xid(workflow_id)
        with _transaction(self) as run:
            # the fence keeps the workflow's row locked until this commits (DBOS's `_check_owner_txn`)
            if owner is not None:
                fenced = run(sql.owner, {"wid": workflow_id})
                if not fenced or fenced[0][0] != owner:
                    raise DBOSWorkflowConflictIDError(workflow_id)
            try:
                rows = run(sql.insert, values)
            except Exception as exc:
                if _unique_violation(self, exc):
                    raise DBOSStepNondeterminismError(workflow_id, result["function_id"]) from exc
                raise
            if rows and (rows[0][0] is None or int(rows[0][0]) != completed_at):
                raise DBOSStepNondeterminismError(workflow_id, result["function_id"])
        DebugTriggers.debug_trigger_point(DebugTriggers.DEBUG_TRIGGER_STEP_COMMIT)

    write()


def _on_sqlite(dbos: Any) -> bool:
    dbos = dbos if dbos is not None else _dbos._dbos_global_instance
    return dbos is not None and isinstance(dbos._sys_db, _SQLite)


def _inline(stage: Any, dbos: Any) -> bool:
    """A step's lookup or record stage on SQLite: run it on the loop (see the module docstring)."""
    return getattr(stage, "__qualname__", "") in (_STEP_LOOKUP, _STEP_RECORD) \
        and getattr(stage, "__module__", "") == _core.__name__ and _on_sqlite(dbos)


def _then(self: Any, next: Any, *, dbos: Any = None) -> Any:
    return _outcome.Pending(lambda: _run_then(self._func, next, dbos))


async def _run_then(func: Any, next: Any, dbos: Any) -> Any:
    # Pending._wrap(func, lambda: next): the same stage, minus `await asyncio.to_thread(lambda: next)`
    if dbos is not None:
        await dbos._configure_asyncio_thread_pool()
    inline = _inline(next, dbos)
    try:
        value = await func()
        result = next(lambda: value) if inline else await asyncio.to_thread(next, lambda: value)
    except asyncio.CancelledError:
        _outcome.dbos_logger.warning(  # pyright: ignore[reportPrivateImportUsage]
            f"Asyncio task cancelled for workflow or step {func}")
        raise
    except BaseException as exp:
        saved = exp
        fail: Any = lambda: _outcome.Pending._raise(saved)  # noqa: E731
        result = next(fail) if inline else await asyncio.to_thread(next, fail)
    if isinstance(result, _outcome.DeferredResult):
        return await result.resolve_async()
    return result


async def _intercept(func: Any, interceptor: Any, *, dbos: Any = None) -> Any:
    # Pending._intercept, with a step's lookup on SQLite run on the loop
    if not _inline(interceptor, dbos):
        return await _STOCK["intercept"].__func__(func, interceptor, dbos=dbos)
    intercepted = interceptor()
    if isinstance(intercepted, _outcome.NoResult):
        return await func()
    if isinstance(intercepted, _outcome.DeferredResult):
        return await intercepted.resolve_async()
    return intercepted


__all__ = ["DBOS_VERSION", "fingerprints", "install", "mismatches", "uninstall"]
