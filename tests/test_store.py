"""The run store on SQLite (WAL) and on a real PostgreSQL: migrations, runs, events, capped
results scoped to their owner, idempotency records."""

from __future__ import annotations

import sqlite3

import pytest
from store_fixtures import fresh_postgres_database

from tether._types import RunResult, RunState, StopReason, TraceEvent, Usage
from tether.store import RunStore
from tether.store._migrations import MIGRATIONS


@pytest.fixture(params=["sqlite", "postgres"])
def where(request, tmp_path):
    if request.param == "sqlite":
        yield str(tmp_path / "runs.db")
    else:
        yield from fresh_postgres_database()


def test_migrations_run_once_and_again_harmlessly(where):
    first = RunStore(where)
    second = RunStore(where)  # a second process opening the same database
    with first.engine.connect() as conn:
        import sqlalchemy as sa

        versions = [v for (v,) in conn.execute(sa.text("SELECT version FROM tether_schema ORDER BY version"))]
    assert versions[-1] == len(MIGRATIONS) and len(set(versions)) == len(versions)
    first.close()
    second.close()


def test_runs_events_and_state_round_trip(where):
    store = RunStore(where)
    store.create_run("r1", "agent", "alice", "do it", config={"model": "x"})
    store.create_run("r1", "agent", "alice", "changed")  # the same id again changes nothing
    assert store.run("r1").prompt == "do it" and store.config("r1") == {"model": "x"}
    events = [TraceEvent("model_call", 1, 0.1, 0.1, {"tool_calls": 1}), TraceEvent("text_delta", 1, 0.1),
              TraceEvent("tool_call", 1, 0.2, 0.05, {"name": "add"})]
    store.add_events("r1", events[:2], 0)
    store.add_events("r1", events[:2], 0)  # a replay writes them again
    state = RunState("r1", "alice", usage=Usage(5, 2, model_calls=1), steps=1, loop_counts={"k": 1})
    result = RunResult("r1", StopReason.COMPLETED, "done", usage=state.usage, trace=events, steps=1, state=state)
    store.finish_run(result)
    row = store.run("r1")
    assert row.status == "completed" and row.answer == "done" and row.usage["input_tokens"] == 5
    assert [e.kind for e in store.events("r1")] == ["model_call", "tool_call"]
    assert store.state("r1") == state
    assert [r.run_id for r in store.runs(user="alice")] == ["r1"] and store.runs(user="bob") == []
    store.close()


def test_findings_are_read_without_the_state(where):
    store = RunStore(where)
    store.create_run("r1", "agent", "alice", "look")
    assert store.findings("r1") == []  # running: nothing yet
    state = RunState("r1", "alice", findings=["grep found 3 errors"])
    store.finish_run(RunResult("r1", StopReason.COMPLETED, "ok", findings=list(state.findings), state=state))
    statements: list[str] = []
    import sqlalchemy as sa

    sa.event.listen(store.engine, "before_cursor_execute", lambda conn, cur, sql, *a: statements.append(sql))
    assert store.findings("r1") == ["grep found 3 errors"]
    assert not any("state" in sql for sql in statements)  # the transcript is not read
    with store.engine.begin() as conn:  # a run finished before migration 3: from its stored state
        conn.execute(sa.text("UPDATE tether_runs SET findings = NULL WHERE run_id = 'r1'"))
    assert store.findings("r1") == ["grep found 3 errors"]
    store.close()


def test_a_restarted_workflow_does_not_unpark_a_run_waiting_for_a_decision(where):
    store = RunStore(where)
    store.create_run("r1", "agent", "alice", "pay")
    store.set_running("r1")
    assert store.run("r1").status == "running"
    pending = {"call_id": "c1", "step": 2}
    for parked in ("awaiting_approval", "decided"):
        store.set_status("r1", parked, pending=pending)
        store.set_running("r1")  # a recovered run replaying to its wait: still confirmable meanwhile
        row = store.run("r1")
        assert row.status == parked and row.pending == pending
    store.set_status("r1", "cancelled")
    store.set_running("r1")  # resumed
    assert store.run("r1").status == "running" and store.run("r1").pending is None
    store.close()


def test_capped_results_belong_to_their_owner_and_handles_are_unguessable(where):
    store = RunStore(where)
    h1, h2 = store.put("alice's text", "alice"), store.put("other", "alice")
    assert h1 != h2 and len(h1) == 18
    assert store.get(h1, "alice") == "alice's text"
    assert store.get(h1, "bob") is None and store.get(h1) is None and store.get("r1", "alice") is None
    store.close()


def test_idempotency_records(where):
    cache = RunStore(where).idempotency()
    assert cache.get("run:1:0") is None
    cache.put("run:1:0", "charged 99")
    cache.put("run:1:0", "charged again")  # the first record stands
    assert cache.get("run:1:0") == "charged 99" and cache.get("run:2:0") is None


def test_sqlite_runs_in_wal_mode(tmp_path):
    path = tmp_path / "runs.db"
    RunStore(str(path)).close()
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_idempotent_tool_acts_once_per_key_through_the_store(tmp_path):
    import asyncio

    from tether import tool
    from tether._types import ToolCall
    from tether.policy._idempotency import idempotent
    from tether.tools._executor import CallContext, Executor

    charges: list[int] = []

    @tool(effect="irreversible")
    def charge(amount: int) -> str:
        """Charge."""
        charges.append(amount)
        return f"charged {amount}"

    store = RunStore(str(tmp_path / "runs.db"))
    ex = Executor([idempotent(charge, store.idempotency())])
    ctx = CallContext("run1", step=1)
    # a server reusing call ids: two different calls named call_0 in two steps both run
    first = asyncio.run(ex.execute(ToolCall("call_0", "charge", {"amount": 99}), ctx, 0))
    ctx.step = 2
    second = asyncio.run(ex.execute(ToolCall("call_0", "charge", {"amount": 99}), ctx, 0))
    # the re-run of step 2's interrupted call (same key, another process) does not charge again
    again = asyncio.run(Executor([idempotent(charge, RunStore(str(tmp_path / "runs.db")).idempotency())]).execute(
        ToolCall("call_0", "charge", {"amount": 99}), ctx, 0))
    assert [first.content, second.content, again.content] == ["charged 99"] * 3 and charges == [99, 99]


def test_usage_stats_count_tool_errors_in_every_grouping(where):
    """A failed tool call counts as an error by day, agent and run as well as by tool; a call parked for
    approval is neither a call nor an error."""
    from tether.store._stats import GROUPS, usage_stats

    store = RunStore(where)
    store.create_run("r1", "agent", "alice", "do it")
    events = [TraceEvent("model_call", 1, 0.1, 0.1, {"model": "m", "input_tokens": 3, "output_tokens": 1}),
              TraceEvent("tool_call", 1, 0.2, 0.05, {"name": "Bash", "is_error": True}),
              TraceEvent("tool_call", 1, 0.3, 0.05, {"name": "Bash", "is_error": False}),
              TraceEvent("tool_call", 1, 0.4, 0.0, {"name": "Bash", "is_error": True,
                                                     "decision": "awaiting_approval"})]
    store.add_events("r1", events, 0)
    state = RunState("r1", "alice", usage=Usage(3, 1, model_calls=1, tool_calls=2), steps=1)
    store.finish_run(RunResult("r1", StopReason.COMPLETED, "done", usage=state.usage, trace=events, steps=1,
                               state=state))
    for by in GROUPS:
        if by == "model":
            continue
        (row,) = usage_stats(store, by)
        assert (row.tool_calls, row.tool_errors) == (2, 1), by
    assert usage_stats(store, "run", user="bob") == []
    store.close()
