"""A parked durable run wakes when its decision arrives, by DBOS's notification listener (a poll of
the notifications table every 0.1 s on SQLite, LISTEN/NOTIFY on PostgreSQL), not by `recv`'s own
re-check of the database, which DBOS does once a minute as a fallback against lost notifications.

The fallback is set far beyond the tests' hang bound here: a run that still resumes after its
approval was woken by the notification. No timing is asserted; a run woken only by the fallback
would hang until HANG and fail. The figures (approval to resume, median and max): bench/durable/wake.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hang import HANG

pytest.importorskip("dbos")

from tether import Agent, Limits, tool
from tether._types import ModelReply, ModelRequest, ToolCall
from tether.models._scripted import ScriptedModel
from tether.policy import ApprovalBook, PendingApprover, SafetyPolicy


@pytest.fixture
def no_fallback_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    from dbos._sys_db import SystemDatabase

    assert SystemDatabase._notification_fallback_polling_interval <= 60  # DBOS's own, which this test outlasts
    monkeypatch.setattr(SystemDatabase, "_notification_fallback_polling_interval", 100 * HANG)


@pytest.fixture
def sqlite_db(tmp_path):
    from tether.durable import teardown

    yield str(tmp_path / "runs.db")
    teardown()


@pytest.fixture
def postgres_db():
    from store_fixtures import fresh_postgres_database

    from tether.durable import teardown

    for url in fresh_postgres_database():
        yield url
        teardown()


def _agent(paid: list[str], database: str) -> Agent:
    from tether.durable import Durable

    @tool(untrusted_output=True)
    def read_invoice() -> str:
        """Read the invoice."""
        return "Invoice: 40 EUR to alice-iban."

    @tool(effect="irreversible")
    def pay(to: str, amount: int) -> str:
        """Pay someone."""
        paid.append(to)
        return f"paid {amount} to {to}"

    def script(request: ModelRequest) -> ModelReply:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done == 0:
            return ModelReply("", [ToolCall("call_0", "read_invoice", {})])
        if done == 1:
            return ModelReply("", [ToolCall("call_0", "pay", {"to": "alice-iban", "amount": 40})])
        return ModelReply("paid")

    return Agent(ScriptedModel(script), tools=[read_invoice, pay], limits=Limits(max_steps=5), user="alice",
                 policy=SafetyPolicy(approver=PendingApprover(ApprovalBook())), name="wake",
                 durable=Durable(database, approval_timeout=100 * HANG))


async def _parked(run_id: str) -> dict[str, Any]:
    """The run's pending call, once it waits (a status reached; HANG only catches a run that never parks)."""
    from tether.durable import runtime

    store = runtime().store
    async with asyncio.timeout(HANG):
        while (row := store.run(run_id)) is None or row.status != "awaiting_approval" or not row.pending:
            await asyncio.sleep(0.01)
    return dict(row.pending)


def _wakes_on_the_decision(database: str) -> None:
    """One run decided through this process's DBOS (the task service's confirm), one through a DBOS
    client of its own (`tether approve`, another process): each resumes and pays once."""
    from dbos import DBOS

    from tether.durable import runtime
    from tether.durable._control import approve, decide

    paid: list[str] = []
    agent = _agent(paid, database)

    async def go() -> None:
        for run_id, send in (("local", lambda p: decide(runtime().store, DBOS, "local", p["call_id"], by="test")),
                             ("client", lambda p: approve(database, "client", p["call_id"], by="test"))):
            task = asyncio.create_task(agent.arun("pay the invoice", run_id=run_id))
            pending = await _parked(run_id)
            assert paid == [] or run_id == "client"
            await asyncio.to_thread(send, pending)
            try:
                result = await asyncio.wait_for(task, HANG)
            except TimeoutError:
                pytest.fail(f"run {run_id} did not resume within {HANG:g} s of its approval: nothing woke its recv")
            assert result.completed and result.answer == "paid", (result.stop_reason, result.error)

    asyncio.run(go())
    assert paid == ["alice-iban", "alice-iban"]  # one payment per run


def test_a_parked_run_wakes_on_its_decision_on_sqlite(sqlite_db, no_fallback_poll):
    _wakes_on_the_decision(sqlite_db)


def test_a_parked_run_wakes_on_its_decision_on_postgres(postgres_db, no_fallback_poll):
    _wakes_on_the_decision(postgres_db)
