"""Batched approvals (issue 44, item 5): the calls one model turn announces that each need approval
are one question for a person, counted once by the approval budget, and each call is checked against
what was approved (bound to its exact action key)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hang import HANG

from tether import Agent, Limits, StopReason
from tether._types import RunState
from tether.events import ApprovalDecided, ApprovalRequested
from tether.models._scripted import ScriptedModel, call
from tether.policy import (
    ApprovalBook,
    ApprovalDecision,
    ApprovalRequest,
    CallbackApprover,
    OracleApprover,
    PendingApprover,
    SafetyPolicy,
    TerminalApprover,
)
from tether.policy._approvals import batch_summary
from tether.tools import Tool, tool

SUMMARY = {"noun": "payment", "amount": "amount", "party": "recipient", "party_noun": "payee"}
PAYS = [{"recipient": "ACME-1", "amount": 1000.0}, {"recipient": "BOB-2", "amount": 200.0},
        {"recipient": "ACME-1", "amount": 40.0}]


class Bank:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def tools(self) -> list[Tool]:
        @tool(untrusted_output=True)
        def read_invoices() -> str:
            """Read the invoices."""
            return "ACME-1 1000, BOB-2 200, ACME-1 40"

        @tool(effect="irreversible", metadata={"approval_summary": SUMMARY})
        def send_money(recipient: str, amount: float) -> str:
            """Send money."""
            self.sent.append({"recipient": recipient, "amount": amount})
            return f"sent {amount} to {recipient}"

        return [read_invoices, send_money]


def _run(approver: Any, *script: Any, max_approvals: int | None = 20) -> tuple[Bank, Any, SafetyPolicy]:
    bank = Bank()
    policy = SafetyPolicy(approver=approver, max_approvals=max_approvals)
    agent = Agent(ScriptedModel(list(script)), tools=bank.tools(), policy=policy, limits=Limits(max_steps=10))
    return bank, agent.run("pay my invoices", run_id="r1"), policy


def _pays() -> list:
    return [call("send_money", **p) for p in PAYS]


class Answers:
    """A terminal person: answers in order, keeps what was shown."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.prompts: list[str] = []
        self.shown: list[str] = []

    def ask(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.answers.pop(0)

    def write(self, text: str) -> int:
        self.shown.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_one_question_for_the_turn_counted_once_by_the_budget() -> None:
    person = Answers("y")
    bank, res, policy = _run(TerminalApprover(ask=person.ask, out=person, by="alice"),
                             call("read_invoices"), _pays(), "paid", max_approvals=1)
    assert res.stop_reason is StopReason.COMPLETED, res.error
    assert bank.sent == PAYS
    assert len(person.prompts) == 1 and person.prompts[0].startswith("Approve all 3?")
    shown = "".join(person.shown)
    assert "3 payments, 1,240.00 in total, to these 2 payees: ACME-1, BOB-2" in shown
    assert shown.count("tool: send_money") == 3  # each call in full below the summary
    records = [r for r in policy.audit.query("r1", tool="send_money")]
    assert [r.decision for r in records] == ["approved:alice"] * 3
    batches = {r.batch for r in records}
    assert len(batches) == 1 and batches != {""}
    decided = [e for e in res.events if isinstance(e, ApprovalDecided)]
    assert len(decided) == 3 and {e.batch for e in decided} == batches


def test_a_denied_group_denies_each_call() -> None:
    person = Answers("n")
    bank, _res, policy = _run(TerminalApprover(ask=person.ask, out=person, by="alice"),
                             call("read_invoices"), _pays(), "did not pay")
    assert bank.sent == [] and len(person.prompts) == 1
    records = policy.audit.query("r1", tool="send_money")
    assert [r.decision for r in records] == ["denied:alice"] * 3 and all(r.batch for r in records)


def test_one_by_one_answers_each_call() -> None:
    person = Answers("o", "y", "n", "y")
    bank, _, _ = _run(TerminalApprover(ask=person.ask, out=person, by="alice"),
                      call("read_invoices"), _pays(), "paid two")
    assert bank.sent == [PAYS[0], PAYS[2]]
    assert len(person.prompts) == 4


def test_an_approver_that_does_not_know_batches_is_asked_per_call() -> None:
    asked: list[ApprovalRequest] = []

    def approve(req: ApprovalRequest) -> bool:
        asked.append(req)
        return True

    bank, res, _ = _run(CallbackApprover(approve), call("read_invoices"), _pays(), "paid")
    assert res.completed and bank.sent == PAYS and len(asked) == 3


def test_a_call_not_in_the_approved_group_still_asks() -> None:
    oracle = OracleApprover([("send_money", p) for p in PAYS])
    bank, _res, _ = _run(oracle, call("read_invoices"), _pays(),
                        call("send_money", recipient="EVE-9", amount=5.0), "done")
    assert bank.sent == PAYS  # the group ran; the later call was asked on its own, and denied
    assert len(oracle.asked) == 2 and oracle.asked[1].arguments["recipient"] == "EVE-9"


def test_each_call_is_held_to_its_own_answer() -> None:
    class Picky:
        async def request(self, req: ApprovalRequest) -> ApprovalDecision:
            raise AssertionError("asked per call")

        async def request_batch(self, batch: Any) -> list[ApprovalDecision]:
            return [ApprovalDecision("approved" if r.arguments["recipient"] == "ACME-1" else "denied", "p")
                    for r in batch.requests]

    bank, _, policy = _run(Picky(), call("read_invoices"), _pays(), "done")
    assert bank.sent == [PAYS[0], PAYS[2]]
    assert sorted(r.decision for r in policy.audit.query("r1", tool="send_money")) == [
        "approved:p", "approved:p", "denied:p"]


def test_pending_batch_is_listed_together_and_decided_at_once() -> None:
    """The task service's shape: each pending call carries its batch; one decision answers the group."""
    bank = Bank()
    policy = SafetyPolicy(approver=PendingApprover(ApprovalBook()), max_approvals=1)
    agent = Agent(ScriptedModel([call("read_invoices"), _pays(), "paid"]), tools=bank.tools(), policy=policy)
    first = agent.run("pay my invoices")
    assert first.stop_reason is StopReason.AWAITING_APPROVAL and bank.sent == []
    assert len(first.pending) == 3 and len({p["batch"] for p in first.pending}) == 1
    assert first.pending[0]["batch_summary"].startswith("3 payments, 1,240.00 in total")
    requested = [e for e in first.events if isinstance(e, ApprovalRequested)]
    assert all(e.batch == first.pending[0]["batch"] for e in requested)
    state = RunState.from_json(first.state.to_json()).approve_batch(first.pending[0]["batch"], by="alice")
    done = agent.run(None, state=state)
    assert done.stop_reason is StopReason.COMPLETED, done.error
    assert bank.sent == PAYS


def test_summary_lists_the_exact_calls_of_a_tool_that_declares_nothing() -> None:
    reqs = [ApprovalRequest("r", None, "post", {"channel": c}, f"k{c}", "", "") for c in ("a", "b")]
    assert batch_summary(reqs) == 'post(channel="a"); post(channel="b")'


# -- the task service: a batch in its approvals API, over real HTTP and a SQLite run database ----------

@contextlib.contextmanager
def parked_payroll(tmp_path: Path) -> Iterator[tuple[Any, dict[str, str], str, dict[str, Any]]]:
    """A real `tether serve` whose payroll task is parked on its batch of three charges: (service, alice's
    headers, task id, the task's body); the service is stopped after."""
    pytest.importorskip("httpx")
    pytest.importorskip("dbos")
    from test_service import Service, submit, wait_status

    svc = Service(tmp_path)
    svc.start(f"{Path(__file__).parent / 'service_agents.py'}:BATCH_AGENTS")
    try:
        alice = svc.key("alice")
        task = submit(svc, alice, "payroll")
        yield svc, alice, task, wait_status(svc, alice, task, "awaiting_approval")
    finally:
        svc.stop()

def test_service_lists_the_batch_and_one_confirm_answers_it(tmp_path: Path) -> None:
    import httpx
    from test_console import csrf_of, login
    from test_service import events, submit, wait_status

    with parked_payroll(tmp_path) as (svc, alice, task, body):
        pending = body["pending_approvals"]
        assert [p["call_id"] for p in pending] == ["p0", "p1", "p2"] and svc.ledger() == []
        assert len({p["batch"] for p in pending}) == 1 and pending[0]["batch"]
        assert pending[0]["batch_summary"] == 'charge(amount=10); charge(amount=20); charge(amount=30)'
        ok = httpx.post(f"{svc.url}/v1/tasks/{task}/confirm", json={"call_id": "p0", "approved": True, "batch": True},
                        headers=alice, timeout=HANG)
        assert ok.status_code == 200, ok.text
        # max_approvals=1: the group was one question, so all three ran
        body = wait_status(svc, alice, task, "completed", "stopped")
        assert body["status"] == "completed", body
        assert sorted(svc.ledger()) == ["charge 10", "charge 20", "charge 30"]
        assert body["answer"] == "Done: charged 10, charged 20, charged 30"
        seen = events(svc, alice, task)
        assert [e for e in seen if e["event"] == "confirm_batch"]
        decided = [e["data"]["approval"] for e in seen if e["event"] == "status" and "approval" in e["data"]]
        assert sorted(d["call_id"] for d in decided) == ["p0", "p1", "p2"]
        assert {d["batch"] for d in decided} == {pending[0]["batch"]}
        # the console shows the group with its one question; "Deny all" answers every call of it
        client = login(svc, alice["Authorization"].removeprefix("Bearer "))
        other = submit(svc, alice, "payroll")
        wait_status(svc, alice, other, "awaiting_approval")
        page = client.get(f"/runs/{other}")
        assert "Approve all 3" in page.text and "charge(amount=10); charge(amount=20)" in page.text
        assert page.text.count('class="batch-call"') == 3
        done = client.post(f"/runs/{other}/decide", data={"csrf": csrf_of(client), "call_id": "p0", "batch": "yes",
                                                          "approved": "no"})
        assert done.status_code == 303, done.text
        body = wait_status(svc, alice, other, "completed", "stopped")
        assert len(svc.ledger()) == 3  # nothing more was charged
        assert body["answer"].count("approval denied by alice") == 3, body["answer"]


def test_a_batch_answer_is_for_its_turn_only() -> None:
    """An answer the group got that a call of it never used does not approve an identical call of a
    later turn, even a turn of one call: it asks again."""
    import asyncio

    from tether.policy import Capabilities, Capability
    from tether.tools._executor import CallContext

    oracle = OracleApprover([("send_money", p) for p in PAYS])
    policy = SafetyPolicy(approver=oracle, capabilities=Capabilities([Capability("send_money", requires_approval=True)],
                                                                    unlisted="inherit"))
    state = policy.start_run("r", None, ["pay my invoices"], [])
    ctx = CallContext(run_id="r", policy_state=state)
    send = Bank().tools()[1]
    items = [(send, send.validator.validate(p), call("send_money", **p)) for p in PAYS]
    decided = asyncio.run(policy.announce_turn(items, ctx))
    assert [d["approved"] for d in decided] == [True] * 3 and len(oracle.asked) == 1
    assert len(state.decisions) == 3  # none used: the calls were never made
    asyncio.run(policy.announce_turn(items[:1], ctx))  # the next turn, one call
    assert state.decisions == {}


def test_the_cli_approver_chain_asks_one_question_for_the_group() -> None:
    """The CLI's terminal approver sits behind its pausing wrapper and its allow rules: both pass the
    group through as one question."""
    from tether.cli._build import PausingApprover
    from tether.policy import RuleApprover

    person = Answers("y")
    approver = RuleApprover([], PausingApprover(TerminalApprover(ask=person.ask, out=person, by="alice"), None))
    bank, res, _ = _run(approver, call("read_invoices"), _pays(), "paid")
    assert res.completed and bank.sent == PAYS and len(person.prompts) == 1


def test_tether_approve_batch_answers_a_service_tasks_batch_at_once(tmp_path: Path) -> None:
    """`tether approve TASK CALL --batch` (another process, on the service's run database) decides the
    whole batch a task is parked on, over a real HTTP service, as `confirm {batch: true}` does."""
    from test_service import wait_status

    with parked_payroll(tmp_path) as (svc, alice, task, body):
        assert [p["call_id"] for p in body["pending_approvals"]] == ["p0", "p1", "p2"]
        done = svc.cli("approve", task, "p0", "--batch", "--reason", "payday")
        assert done.returncode == 0, done.stderr
        assert "approved 3 calls of one batch" in done.stderr and '"amount": 30' in done.stderr, done.stderr
        body = wait_status(svc, alice, task, "completed", "stopped")
        assert body["status"] == "completed", body  # max_approvals=1: one answer for the group
        assert sorted(svc.ledger()) == ["charge 10", "charge 20", "charge 30"]
        again = svc.cli("approve", task, "p0", "--batch")
        assert again.returncode == 1 and "not awaiting an approval" in again.stderr, again.stderr


def test_calls_whose_hidden_values_need_approval_are_one_question() -> None:
    """A clean context, but each payment's recipient is a hidden value someone else wrote: the
    question is about the labels, asked once for the turn, and the answer binds to the values put in."""
    sent: list[dict[str, Any]] = []

    @tool(untrusted_output=True, hide_output=True)
    def read_invoices() -> str:
        """Read the invoices."""
        return '{"a": "ACME-1", "b": "BOB-2"}'

    @tool(effect="irreversible", metadata={"approval_summary": SUMMARY})
    def send_money(recipient: str, amount: float) -> str:
        """Send money."""
        sent.append({"recipient": recipient, "amount": amount})
        return f"sent {amount} to {recipient}"

    oracle = OracleApprover([("send_money", {"recipient": "ACME-1", "amount": 10.0}),
                             ("send_money", {"recipient": "BOB-2", "amount": 20.0})])
    policy = SafetyPolicy(approver=oracle)
    script = [call("read_invoices"), [call("send_money", recipient="$v1_1.a", amount=10.0),
                                      call("send_money", recipient="$v1_1.b", amount=20.0)], "paid"]
    agent = Agent(ScriptedModel(script), tools=[read_invoices, send_money], policy=policy, limits=Limits(max_steps=10))
    res = agent.run("pay my invoices", run_id="r1")
    assert res.completed, res.error
    assert sent == [{"recipient": "ACME-1", "amount": 10.0}, {"recipient": "BOB-2", "amount": 20.0}]
    assert len(oracle.asked) == 1  # one question for the two
    assert "hidden values" in oracle.asked[0].reason  # asked for the labels: the context is clean
    assert oracle.asked[0].arguments["recipient"] == "ACME-1"  # the values put in, as the call runs them
