"""Batched approvals (issue 44, item 5): the calls one model turn announces that each need approval
are one question for a person, counted once by the approval budget, and each call is checked against
what was approved (bound to its exact action key)."""

from __future__ import annotations

from typing import Any

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
