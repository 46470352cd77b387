"""`RunStore`: one SQLAlchemy engine over SQLite (WAL, synchronous=NORMAL) or PostgreSQL.

Every write is keyed so that doing it twice is harmless (a replayed durable run re-emits the same
events, the same status changes), and every read is one indexed query."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from tether._errors import OperationFailed
from tether._types import RunResult, RunState, to_json, to_jsonable
from tether.events import TraceEvent
from tether.store._migrations import migrate
from tether.tools._results import new_handle


def default_database_path(env: Mapping[str, str] | None = None) -> Path:
    """`$TETHER_HOME/tether.db`, else the user's data dir (`$XDG_DATA_HOME/tether/tether.db`)."""
    env = os.environ if env is None else env
    home = env.get("TETHER_HOME")
    base = Path(home) if home else Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "tether"
    return base / "tether.db"


def engine_url(where: str | os.PathLike[str] | None) -> str:
    """A database URL from a path, a `sqlite://`/`postgresql://` URL, or None (the default file)."""
    where = os.fspath(default_database_path()) if where is None else os.fspath(where)
    text = where
    if text.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + text.split("://", 1)[1]
    if "://" in text:
        return text
    path = Path(text).expanduser()
    if where == os.fspath(default_database_path()):
        path.parent.mkdir(parents=True, exist_ok=True)  # the default's folder is ours to make
    elif not path.parent.is_dir():  # a typo in a path given should not quietly make a new, empty store
        raise OperationFailed(f"cannot open the run store {text}: the directory {path.parent} does not exist")
    return f"sqlite:///{path.resolve()}"


def make_engine(url: str) -> sa.Engine:
    """An engine with the settings the trials measured: SQLite in WAL with synchronous=NORMAL
    (~2 ms a step instead of ~14), writers serialised, lock contention ridden out."""
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = "IMMEDIATE"
            dbapi_conn.execute("PRAGMA busy_timeout=30000")
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")
            dbapi_conn.execute("PRAGMA foreign_keys=ON")

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def _payload_json(data: dict[str, Any]) -> str:
    """An event's payload as JSON: directly when it is plain JSON data (nearly always), else through
    pydantic (models, dates, non-finite numbers)."""
    try:
        return json.dumps(data, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(to_jsonable(data), ensure_ascii=False)


def _without_text(events: list[TraceEvent]) -> list[TraceEvent]:
    """A run's events as stored, and numbered: without its text deltas (tether_text_deltas holds
    those). Start events are stored too, so a reader sees a step open before it ends."""
    return [e for e in events if e.kind != "text_delta"]


@dataclass(slots=True)
class RunRow:
    """One run as the store keeps it."""

    run_id: str
    agent: str
    user: str | None
    status: str
    prompt: str
    stop_reason: str | None
    error: str | None
    answer: str | None
    usage: dict[str, Any]
    steps: int
    pending: dict[str, Any] | None
    parent_run: str | None
    created_at: float
    updated_at: float


_COLUMNS = ("run_id, agent, user_id, status, prompt, stop_reason, error, answer, usage, steps, pending, "
            "parent_run, created_at, updated_at")


class RunStore:
    """Runs, events, capped results, idempotency and audit records in one database."""

    def __init__(self, where: str | os.PathLike[str] | None = None, *, engine: sa.Engine | None = None) -> None:
        self.url = engine_url(where) if engine is None else str(engine.url)
        self.engine = engine or make_engine(self.url)
        self._lock = threading.Lock()
        migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def _write(self, sql: str, params: dict[str, Any] | list[dict[str, Any]]) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(sql), params)

    def _rows(self, sql: str, params: dict[str, Any]) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params))

    # -- runs ------------------------------------------------------------------------------------

    def create_run(self, run_id: str, agent: str, user: str | None, prompt: str, *,
                   config: dict[str, Any] | None = None, parent_run: str | None = None) -> None:
        """Record a new run (a second call for the same id changes nothing)."""
        now = time.time()
        self._write(
            "INSERT INTO tether_runs (run_id, agent, user_id, status, prompt, usage, config, parent_run, created_at,"
            " updated_at) VALUES (:r, :a, :u, 'pending', :p, '{}', :c, :parent, :t, :t) ON CONFLICT DO NOTHING",
            {"r": run_id, "a": agent, "u": user, "p": prompt, "c": json.dumps(config) if config else None,
             "parent": parent_run, "t": now})

    def set_status(self, run_id: str, status: str, *, pending: dict[str, Any] | None = None) -> None:
        self._write("UPDATE tether_runs SET status = :s, pending = :p, updated_at = :t WHERE run_id = :r",
                    {"s": status, "p": json.dumps(pending) if pending is not None else None, "t": time.time(),
                     "r": run_id})

    def claim_decision(self, run_id: str, pending: dict[str, Any]) -> bool:
        """Mark the run `decided` only if it still awaits approval: one conditional write, so of two
        people answering the same call at once exactly one wins (the other gets False)."""
        with self.engine.begin() as conn:
            done = conn.execute(sa.text(
                "UPDATE tether_runs SET status = 'decided', pending = :p, updated_at = :t"
                " WHERE run_id = :r AND status = 'awaiting_approval'"),
                {"p": json.dumps(pending), "t": time.time(), "r": run_id})
            return done.rowcount == 1

    def set_running(self, run_id: str) -> None:
        """The run's workflow (re)starts: `running`, unless the run is parked on a person's decision
        (a recovered run replays up to that same wait; meanwhile its pending call stays confirmable)."""
        self._write("UPDATE tether_runs SET status = 'running', pending = NULL, updated_at = :t WHERE run_id = :r"
                    " AND status NOT IN ('awaiting_approval', 'decided')", {"t": time.time(), "r": run_id})

    def finish_run(self, result: RunResult, *, stored_events: int = 0, first_seq: int = 0) -> None:
        """The run's outcome, its final state and its events (all but the first `stored_events`,
        which `add_events` wrote already; the first of the trace is seq `first_seq`), in one
        transaction."""
        with self.engine.begin() as conn:
            self._finish(conn, result, _status(result), stored_events, first_seq)

    def record_run(self, result: RunResult, *, agent: str, user: str | None, prompt: str,
                   config: dict[str, Any] | None = None) -> None:
        """A finished in-memory run (`tether -p`): its row, outcome, state and events in one
        transaction, written once it ended (nothing on its per-step path). Nothing can resume it, so
        a run that stopped awaiting an approval is stored as `stopped`."""
        status = _status(result)
        with self.engine.begin() as conn:
            now = time.time()
            conn.execute(sa.text(
                "INSERT INTO tether_runs (run_id, agent, user_id, status, prompt, usage, config, created_at,"
                " updated_at) VALUES (:r, :a, :u, 'pending', :p, '{}', :c, :t, :t)"),
                {"r": result.run_id, "a": agent, "u": user, "p": prompt, "c": json.dumps(config) if config else None,
                 "t": now})
            self._finish(conn, result, "stopped" if status == "awaiting_approval" else status, 0, 0)

    def _finish(self, conn: sa.Connection, result: RunResult, status: str, stored_events: int,
                first_seq: int) -> None:
        conn.execute(sa.text(
            "UPDATE tether_runs SET status = :s, stop_reason = :sr, error = :e, answer = :a, usage = :u,"
            " steps = :n, pending = NULL, state = :st, findings = :f, updated_at = :t WHERE run_id = :r"),
            {"s": status, "sr": result.stop_reason.value, "e": result.error, "a": result.answer,
             "u": to_json(result.usage), "n": result.steps, "f": json.dumps(list(result.findings)),
             "st": result.state.to_json() if result.state is not None else None, "t": time.time(),
             "r": result.run_id})
        self._events(conn, result.run_id, _without_text(result.trace)[stored_events:], first_seq + stored_events)

    def add_events(self, run_id: str, events: list[TraceEvent], first_seq: int) -> None:
        """Events `first_seq`.. of a run (a replay writing them again changes nothing)."""
        with self.engine.begin() as conn:
            self._events(conn, run_id, _without_text(events), first_seq)

    def _events(self, conn: sa.Connection, run_id: str, events: list[TraceEvent], first_seq: int) -> None:
        """`events` (no text deltas among them) as seq `first_seq`.. of the run."""
        # One multi-row INSERT per 100 events (a turn's events are one statement, however many kinds
        # it has), bound parameters only.
        for start in range(0, len(events), 100):
            chunk = events[start:start + 100]
            params: dict[str, object] = {"r": run_id}
            values = []
            for i, e in enumerate(chunk):
                values.append(f"(:r, :q{i}, :k{i}, :s{i}, :t{i}, :d{i}, :data{i})")
                params.update({f"q{i}": first_seq + start + i, f"k{i}": e.kind, f"s{i}": e.step, f"t{i}": e.t,
                               f"d{i}": e.duration, f"data{i}": _payload_json(e.data)})
            conn.execute(sa.text("INSERT INTO tether_events (run_id, seq, kind, step, t, duration, data) VALUES "
                                 + ", ".join(values) + " ON CONFLICT DO NOTHING"), params)

    # -- streamed text ---------------------------------------------------------------------------

    def add_text_deltas(self, run_id: str, seq: int, first_idx: int, texts: list[str], *, restart: bool = False) -> None:
        """Streamed text pieces `first_idx`.. that precede stored event `seq`; `restart` marks the first
        piece of a model call that began again (after a crash) and streams its text anew."""
        rows = [{"r": run_id, "q": seq, "i": first_idx + n, "x": text, "re": int(restart and n == 0)}
                for n, text in enumerate(texts)]
        if rows:
            self._write("INSERT INTO tether_text_deltas (run_id, seq, idx, text, restart) VALUES (:r, :q, :i, :x, :re)"
                        " ON CONFLICT DO NOTHING", rows)

    def next_text_delta(self, run_id: str, seq: int) -> int:
        """The index the next text piece before event `seq` gets (0 unless an earlier attempt wrote some)."""
        rows = self._rows("SELECT MAX(idx) FROM tether_text_deltas WHERE run_id = :r AND seq = :q",
                          {"r": run_id, "q": seq})
        return 0 if not rows or rows[0][0] is None else int(rows[0][0]) + 1

    def run(self, run_id: str) -> RunRow | None:
        rows = self._rows(f"SELECT {_COLUMNS} FROM tether_runs WHERE run_id = :r", {"r": run_id})
        return _row(rows[0]) if rows else None

    def runs(self, *, limit: int = 50, status: str | None = None, user: str | None = None,
             before: float | None = None, agent: str | None = None, parent: str | None = None) -> list[RunRow]:
        """The latest runs first (created before `before`, when given: the next page); `parent`: the
        sub-agent runs of that run."""
        given = {"status = :s": ("s", status), "agent = :a": ("a", agent), "user_id = :u": ("u", user),
                 "created_at < :b": ("b", before), "parent_run = :p": ("p", parent)}
        where = [cond for cond, (_, value) in given.items() if value is not None]
        params: dict[str, Any] = {"n": limit, **{k: v for k, v in given.values() if v is not None}}
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return [_row(r) for r in self._rows(
            f"SELECT {_COLUMNS} FROM tether_runs{clause} ORDER BY created_at DESC LIMIT :n", params)]

    def state(self, run_id: str) -> RunState | None:
        rows = self._rows("SELECT state FROM tether_runs WHERE run_id = :r", {"r": run_id})
        return RunState.from_json(rows[0][0]) if rows and rows[0][0] else None

    def findings(self, run_id: str) -> list[str]:
        """The findings of a finished run (its stored state's, for runs finished before migration 3)."""
        rows = self._rows("SELECT findings FROM tether_runs WHERE run_id = :r", {"r": run_id})
        if rows and rows[0][0] is not None:
            return list(json.loads(rows[0][0]))
        state = self.state(run_id)
        return list(state.findings) if state is not None else []

    def config(self, run_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT config FROM tether_runs WHERE run_id = :r", {"r": run_id})
        return json.loads(rows[0][0]) if rows and rows[0][0] else None

    def forked_from(self, run_ids: list[str]) -> dict[str, dict[str, Any]]:
        """For each of `run_ids` that is a fork: {"run": parent id, "step": N} (kept in its config)."""
        if not run_ids:
            return {}
        names = {f"r{i}": r for i, r in enumerate(run_ids)}
        rows = self._rows(f"SELECT run_id, config FROM tether_runs WHERE run_id IN ({', '.join(':' + n for n in names)})"
                          " AND config IS NOT NULL", names)
        found = {r: json.loads(c).get("forked_from") for r, c in rows}
        return {r: f for r, f in found.items() if isinstance(f, dict)}

    def forks(self, run_id: str, user: str | None) -> list[tuple[str, int]]:
        """(fork id, step) of `user`'s runs forked from `run_id`, oldest first (a scan of the user's
        runs with a config: for a page, not a step)."""
        who = "user_id = :u" if user is not None else "user_id IS NULL"
        rows = self._rows(f"SELECT run_id, config FROM tether_runs WHERE {who} AND config LIKE :p ORDER BY created_at",
                          {"u": user, "p": '%"forked_from"%'})
        out = []
        for fork_id, config in rows:
            f = json.loads(config).get("forked_from")
            if isinstance(f, dict) and f.get("run") == run_id:
                out.append((fork_id, int(f.get("step", 0))))
        return out

    def next_seq(self, run_id: str) -> int:
        """The seq the run's next event gets (0 for a run with none)."""
        [(top,)] = self._rows("SELECT MAX(seq) FROM tether_events WHERE run_id = :r", {"r": run_id})
        return 0 if top is None else int(top) + 1

    def events(self, run_id: str) -> list[TraceEvent]:
        return [TraceEvent(k, int(s), float(t), float(d), json.loads(data)) for k, s, t, d, data in self._rows(
            "SELECT kind, step, t, duration, data FROM tether_events WHERE run_id = :r ORDER BY seq", {"r": run_id})]

    # -- capped results (tether.tools._results.Results) -------------------------------------------

    def put(self, text: str, owner: str | None = None) -> str:
        handle = new_handle()
        self._write("INSERT INTO tether_results (handle, owner, body, created_at) VALUES (:h, :o, :b, :t)",
                    {"h": handle, "o": owner, "b": text, "t": time.time()})
        return handle

    def get(self, handle: str, owner: str | None = None) -> str | None:
        rows = self._rows("SELECT owner, body FROM tether_results WHERE handle = :h", {"h": handle})
        if not rows or rows[0][0] != owner:
            return None
        body: str = rows[0][1]
        return body

    # -- idempotency (tether.policy._idempotency.IdempotencyCache) --------------------------------

    def idempotency(self) -> StoreIdempotency:
        return StoreIdempotency(self)

    # -- audit -----------------------------------------------------------------------------------

    def add_audit(self, run_id: str, seq: int, record: dict[str, Any]) -> None:
        self._write("INSERT INTO tether_audit (run_id, seq, record) VALUES (:r, :q, :x) ON CONFLICT DO NOTHING",
                    {"r": run_id, "q": seq, "x": json.dumps(record, default=str)})

    def audit(self, run_id: str) -> list[dict[str, Any]]:
        return [json.loads(x) for (x,) in self._rows(
            "SELECT record FROM tether_audit WHERE run_id = :r ORDER BY seq", {"r": run_id})]


class StoreIdempotency:
    """An `IdempotencyCache` over the run store: a tool wrapped with `idempotent(tool, cache)` acts
    at most once per key (`run_id:step:index`) across processes and restarts."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def get(self, key: str) -> str | None:
        rows = self.store._rows("SELECT value FROM tether_idempotency WHERE key = :k", {"k": key})
        return rows[0][0] if rows else None

    def put(self, key: str, value: str) -> None:
        self.store._write("INSERT INTO tether_idempotency (key, value, created_at) VALUES (:k, :v, :t)"
                          " ON CONFLICT DO NOTHING", {"k": key, "v": value, "t": time.time()})


def _status(result: RunResult) -> str:
    """The run row's status for how the run ended."""
    reason = result.stop_reason.value
    if reason == "awaiting_approval":
        return reason
    return "completed" if result.completed else "cancelled" if reason == "cancelled" else \
        "error" if reason == "error" else "stopped"


def _row(r: Any) -> RunRow:
    return RunRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.loads(r[8] or "{}"), int(r[9]),
                  json.loads(r[10]) if r[10] else None, r[11], float(r[12]), float(r[13]))


__all__ = ["RunRow", "RunStore", "StoreIdempotency", "default_database_path", "engine_url"]
