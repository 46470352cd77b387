"""tether.durable._dbos_fastpath: DBOS's step checkpoints with less Python, the same rows and errors.

The pinned-source test fails when DBOS changes (then the fast path stays off until re-reviewed);
the others compare the fast path with DBOS's own methods on the same database, and count the
statements and thread hops of a durable run's steps."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hang import HANG

pytest.importorskip("dbos")

import sqlalchemy as sa
from dbos import _outcome
from dbos._error import (
    DBOSStepNondeterminismError,
    DBOSUnexpectedStepError,
    DBOSWorkflowCancelledError,
    DBOSWorkflowConflictIDError,
)

from tether import Agent, Limits, tool
from tether._types import ModelReply, ModelRequest, ToolCall
from tether.durable import _dbos_fastpath as dbos_fastpath
from tether.models._scripted import ScriptedModel
from tether.tools._executor import AllowAll


@pytest.fixture
def durable_db(tmp_path):
    from tether.durable import teardown

    dbos_fastpath.install()  # opt-in (Durable(fastpath=True)): on for these tests
    yield str(tmp_path / "runs.db")
    teardown()
    dbos_fastpath.uninstall()


@pytest.fixture(params=["sqlite", "postgres"])
def any_db(request, tmp_path):
    """A SQLite file, then a fresh PostgreSQL database: the fast path covers both."""
    from tether.durable import teardown

    dbos_fastpath.install()
    if request.param == "sqlite":
        yield str(tmp_path / "runs.db")
    else:
        from store_fixtures import fresh_postgres_database

        for url in fresh_postgres_database():
            yield url
            teardown()  # before the database is dropped
    teardown()
    dbos_fastpath.uninstall()


def test_the_installed_dbos_is_the_reviewed_one():
    # A DBOS upgrade lands here: re-read the functions named in the message against
    # tether/durable/_dbos_fastpath.py, then update PINNED (the fast path is off until then).
    assert dbos_fastpath.mismatches() == []
    assert dbos_fastpath.install() is True
    dbos_fastpath.uninstall()  # opt-in: off unless asked for


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return "value-" + key


def _script(request: ModelRequest) -> ModelReply:
    turns = int(next(m.content for m in request.messages if m.role == "user").split()[-1])
    done = sum(1 for m in request.messages if m.role == "tool")
    if done >= turns:
        return ModelReply("done")
    return ModelReply("", [ToolCall(f"c{done}", "lookup", {"key": str(done)})])


def _agent(name: str, durable_db: str) -> Agent:
    return Agent(ScriptedModel(_script), tools=[lookup], policy=AllowAll(), name=name, durable=durable_db,
                 limits=Limits(max_steps=50, max_repeats=None))


def _sys_db():
    from dbos._dbos import _get_dbos_instance

    return _get_dbos_instance()._sys_db


def _outcome_of(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except BaseException as exc:  # DBOS's cancellation is a BaseException; compared by type and text
        return ("raised", type(exc).__name__, str(exc))


def _set(sys_db, workflow_id: str, **values) -> None:
    ws = sys_db.tables.workflow_status
    with sys_db.engine.begin() as c:
        c.execute(sa.update(ws).where(ws.c.workflow_uuid == workflow_id).values(**values))


def test_the_fast_step_lookup_answers_as_dbos_does(any_db):
    agent = _agent("fp_check", any_db)
    assert agent.run("go 2", run_id="fp1").completed
    sys_db = _sys_db()
    stock = dbos_fastpath._STOCK["check"]
    fast = dbos_fastpath._check_operation_execution
    cases = [("fp1", 1, "model"), ("fp1", 2, "tool:lookup"), ("fp1", 2, "model"),  # recorded; wrong name
             ("fp1", 999, "model"), ("no-such-run", 1, "model")]  # not recorded; no workflow
    answers = [(_outcome_of(stock, sys_db, *c), _outcome_of(fast, sys_db, *c)) for c in cases]
    for old, new in answers:
        assert old == new
    kinds = [a[0][:2] for a in answers]
    assert kinds[0][0] == "ok" and kinds[0][1]["output"] and kinds[3] == ("ok", None)
    assert answers[2][0][1] == DBOSUnexpectedStepError.__name__ and answers[4][0][1] == "AssertionError"
    _set(sys_db, "fp1", status="CANCELLED")
    old, new = _outcome_of(stock, sys_db, "fp1", 1, "model"), _outcome_of(fast, sys_db, "fp1", 1, "model")
    assert old == new and old[1] == DBOSWorkflowCancelledError.__name__
    # a shard key is DBOS's own business (here: refused, as this database is not sharded)
    old, new = (_outcome_of(fn, sys_db, "fp1", 1, "model", owner_key="k") for fn in (stock, fast))
    assert old == new and old[0] == "raised"


def _step(function_id: int, output: str | None = '"out"', error: str | None = None) -> dict:
    return {"workflow_uuid": "fp2", "function_id": function_id, "function_name": "tool:lookup", "output": output,
            "error": error, "serialization": "portable_json", "started_at_epoch_ms": 1_000,
            "child_workflow_id": None}


def test_the_fast_step_record_writes_and_refuses_as_dbos_does(any_db):
    agent = _agent("fp_record", any_db)
    assert agent.run("go 1", run_id="fp2").completed
    sys_db = _sys_db()
    stock, fast = dbos_fastpath._STOCK["record"], dbos_fastpath._record_operation_result
    _set(sys_db, "fp2", owner_xid="tok")
    for fn, first in ((stock, 100), (fast, 200)):  # the same calls, on step ids of their own
        assert _outcome_of(fn, sys_db, _step(first), completed_at_epoch_ms=5_000, owner_xid="tok")[0] == "ok"
        assert _outcome_of(fn, sys_db, _step(first + 1, None, '"boom"'), completed_at_epoch_ms=5_000)[0] == "ok"
    oo = sys_db.tables.operation_outputs
    columns = [oo.c.function_id, oo.c.function_name, oo.c.output, oo.c.error, oo.c.child_workflow_id,
               oo.c.started_at_epoch_ms, oo.c.completed_at_epoch_ms, oo.c.serialization, oo.c.application_name,
               oo.c.retention_timestamp.is_not(None)]
    with sys_db.engine.connect() as c:
        rows = {fid: tuple(r) for fid, *r in c.execute(
            sa.select(*columns).where(oo.c.workflow_uuid == "fp2", oo.c.function_id >= 100))}
    assert rows[100] == rows[200] and rows[101] == rows[201] and rows[100][1] == '"out"'
    refusals = [  # the same step again at another time; a token that no longer owns the run
        (dict(_step(100)), {"completed_at_epoch_ms": 6_000}, DBOSStepNondeterminismError),
        (dict(_step(102)), {"completed_at_epoch_ms": 5_000, "owner_xid": "stale"}, DBOSWorkflowConflictIDError),
    ]
    for step, kwargs, error in refusals:
        old = _outcome_of(stock, sys_db, step, **kwargs)
        step["function_id"] += 100
        new = _outcome_of(fast, sys_db, step, **kwargs)
        assert old[:2] == new[:2] == ("raised", error.__name__)
    # a retry of the very same write (same completion time) is not a conflict, as in DBOS
    assert _outcome_of(fast, sys_db, _step(200), completed_at_epoch_ms=5_000)[0] == "ok"
    # what the fast path does not mirror goes to DBOS's own method: a child workflow's step, a shard key
    child = {**_step(300), "child_workflow_id": "fp2-child"}
    assert _outcome_of(fast, sys_db, child, completed_at_epoch_ms=5_000)[0] == "ok"
    with sys_db.engine.connect() as c:
        assert c.execute(sa.select(oo.c.child_workflow_id).where(
            oo.c.workflow_uuid == "fp2", oo.c.function_id == 300)).scalar() == "fp2-child"
    old, new = (_outcome_of(fn, sys_db, _step(fid), owner_key="k") for fn, fid in ((stock, 301), (fast, 302)))
    assert old == new and old[0] == "raised"


class _Counts:
    """Every statement the run's work has SQLite run on the store's pool (sqlite3's trace callback: also
    BEGIN and COMMIT, also on the bare DBAPI connections the fast path uses) and every hop to a thread.
    The run's work: what its thread runs, and what it hands to threads with asyncio.to_thread. DBOS's
    own background threads (queue, scheduler, jobs) share the pool, ~10 statements a second whatever
    the run does: how many fall inside a run depends on how long it takes, so they are not counted."""

    def __init__(self, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements = 0
        self.hops = 0
        self.runner = threading.get_ident()  # Agent.run runs its loop in the calling thread
        self.handed = threading.local()  # .on while a thread runs what the run handed it
        sa.event.listen(engine, "checkout", self._trace)
        real = asyncio.to_thread

        async def to_thread(func, /, *args, **kwargs):
            self.hops += 1
            return await real(self._handed_over, func, *args, **kwargs)

        monkeypatch.setattr(asyncio, "to_thread", to_thread)

    def _handed_over(self, func, /, *args, **kwargs):
        self.handed.on = True
        try:
            return func(*args, **kwargs)
        finally:
            self.handed.on = False

    def _trace(self, dbapi_conn: object, *_: object) -> None:
        if hasattr(dbapi_conn, "set_trace_callback"):  # sqlite3
            dbapi_conn.set_trace_callback(self._statement)

    def _statement(self, *_: object) -> None:
        if threading.get_ident() == self.runner or getattr(self.handed, "on", False):
            self.statements += 1


def _per_turn(agent: Agent, counts: _Counts, name: str) -> tuple[int, int]:
    """Statements and thread hops one more tool turn (a model step and a tool step) adds, checked
    to be the same early and late in a run: nothing per step grows with the run's history."""
    seen = []
    for turns in (2, 6, 12):
        s, h = counts.statements, counts.hops
        assert agent.run(f"go {turns}", run_id=f"{name}{turns}").completed
        seen.append((counts.statements - s, counts.hops - h, turns))
    (s1, h1, t1), (s2, h2, t2), (s3, h3, t3) = seen
    assert (s2 - s1) * (t3 - t2) == (s3 - s2) * (t2 - t1) and (h2 - h1) * (t3 - t2) == (h3 - h2) * (t2 - t1), seen
    return (s3 - s2) // (t3 - t2), (h3 - h2) // (t3 - t2)


def test_each_step_costs_a_fixed_number_of_statements_and_thread_hops(durable_db, monkeypatch):
    from tether.durable import _runner, runtime

    # every tool call here is quick, whatever the machine's load: its start is never written on its own
    # (a call still running after LIVE_AFTER is; on a busy machine even this lookup can take 0.25 s)
    monkeypatch.setattr(_runner, "LIVE_AFTER", HANG)
    agent = _agent("fp_counts", durable_db)
    assert agent.run("go 1", run_id="fp_warm").completed  # DBOS launched
    counts = _Counts(runtime().store.engine, monkeypatch)
    neighbour = _Neighbour(runtime().store.engine)  # as DBOS's background threads are, only busier
    # per turn: 2 steps x (1 lookup + BEGIN, owner check, insert of the output, COMMIT) + the turn's
    # events (BEGIN, one multi-row insert of its stored events, COMMIT: a quick tool's start goes with
    # them); no thread hop: on SQLite the lookup and record run on the loop
    assert _per_turn(agent, counts, "fast") == (13, 0)
    dbos_fastpath.uninstall()  # DBOS's own: two SELECTs per lookup, a hop that only fetches a function
    assert _per_turn(agent, counts, "stock") == (15, 6)
    assert neighbour.stop() > 0  # it was there all along, and not counted


class _Neighbour:
    """Another thread running statements on the same pool until stopped."""

    def __init__(self, engine: sa.Engine) -> None:
        self.ran = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(engine,), daemon=True)
        self._thread.start()

    def _run(self, engine: sa.Engine) -> None:
        while not self._stop.wait(0.002):
            with engine.connect() as c:
                c.exec_driver_sql("SELECT 1")
            self.ran += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(HANG)
        return self.ran


@pytest.fixture
def durable_pg():
    from store_fixtures import fresh_postgres_database

    from tether.durable import teardown

    dbos_fastpath.install()
    for url in fresh_postgres_database():
        yield url
        teardown()  # before the database is dropped
    dbos_fastpath.uninstall()


def test_on_postgres_a_step_keeps_its_thread_hops(durable_pg, monkeypatch):
    # the lookup and record of a step are network round trips there: they stay off the event loop
    agent = _agent("fp_pg", durable_pg)
    assert agent.run("go 1", run_id="fp_pg_warm").completed
    from tether.durable import runtime

    counts = _Counts(runtime().store.engine, monkeypatch)  # statements: SQLite's trace only, 0 here
    assert _per_turn(agent, counts, "pg") == (0, 4)  # 2 steps x (lookup, record)


def test_on_postgres_a_run_rides_out_its_connections_being_cut(durable_pg):
    # every connection of the run's database is cut twice between steps (as by a server restart): the
    # fast path's next statements get fresh connections (the pool checks them at checkout), and a
    # statement that fails on a cut connection is a DBAPIError that DBOS's db_retry retries, as for
    # DBOS's own statements
    import os

    import psycopg

    name = durable_pg.rsplit("/", 1)[1]
    cuts: list[int] = []

    @tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        if key in ("1", "3"):  # every connection of the run's database dropped, as by a restart
            with psycopg.connect(os.environ["TETHER_TEST_POSTGRES"], autocommit=True) as admin:
                cuts.append(len(admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                              "datname = %s AND pid <> pg_backend_pid()", (name,)).fetchall()))
        return "value-" + key

    agent = Agent(ScriptedModel(_script), tools=[lookup], policy=AllowAll(), name="fp_cut", durable=durable_pg,
                  limits=Limits(max_steps=50, max_repeats=None))
    result = agent.run("go 5", run_id="fp_cut1")
    assert result.completed and result.answer == "done", result.error
    assert len(cuts) == 2 and all(n > 0 for n in cuts)  # connections were there to cut, twice


async def test_the_hopless_then_runs_the_next_stage_in_a_thread_with_the_value_or_the_error():
    loop_thread = threading.get_ident()

    def after(get):
        try:
            return ("value", get(), threading.get_ident() != loop_thread)
        except ValueError as exc:
            return ("error", str(exc), threading.get_ident() != loop_thread)

    async def good():
        return 42

    async def bad():
        raise ValueError("boom")

    assert await dbos_fastpath._then(_outcome.Pending(good), after)() == ("value", 42, True)
    assert await dbos_fastpath._then(_outcome.Pending(bad), after)() == ("error", "boom", True)
