"""Plan mode asks about its approvals in one question, as the loop does for a turn's calls: a batching
pass runs the plan with reads made and effects not, collects the calls that would ask, and the
approver answers them together; the real pass then uses each answer once, for that exact call."""

from __future__ import annotations

from typing import Any

from tether import tool
from tether._output import FINAL_TOOL
from tether.models._scripted import ScriptedModel, call
from tether.plan import PlanMode
from tether.policy import ApprovalBatch, ApprovalDecision, ApprovalRequest


class Batcher:
    """Answers single questions and batches; approves calls whose recipient is not `refuse`."""

    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.questions: list[ApprovalBatch] = []
        self.single: list[ApprovalRequest] = []

    def _decide(self, req: ApprovalRequest) -> ApprovalDecision:
        ok = req.arguments.get("recipient") != self.refuse
        return ApprovalDecision("approved" if ok else "denied", "person")

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        self.single.append(req)
        return self._decide(req)

    async def request_batch(self, batch: ApprovalBatch) -> list[ApprovalDecision]:
        self.questions.append(batch)
        return [self._decide(r) for r in batch.requests]


class OneByOne:
    def __init__(self) -> None:
        self.single: list[ApprovalRequest] = []

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        self.single.append(req)
        return ApprovalDecision("approved", "person")


def bank(log: list[str]) -> list[Any]:
    @tool(untrusted_output=True, effect="read_only")
    def read_invoices() -> str:
        """The invoices someone sent (anyone can write them)."""
        log.append("read")
        return "pay A1 10, B2 20, C3 30"

    @tool(effect="irreversible", metadata={"approval_summary": {"noun": "payment", "amount": "amount", "party": "recipient"}})
    def send_money(recipient: str, amount: float) -> str:
        """Send money."""
        log.append(f"sent {recipient} {amount:g}")
        return "sent"

    return [read_invoices, send_money]


PAYS = ('inv = read_invoices()\nrows = extract("the payments", inv, {"recipients": "list[str]"})\n'
        'for r in rows["recipients"]:\n    send_money(recipient=r, amount=10)\nfinal_answer("paid")')
READ = [{"recipients": ["A1", "B2", "C3"]}]


def run(program: str, approver: Any, reads: list[dict[str, Any]] | None = None) -> tuple[Any, list[str], ScriptedModel]:
    log: list[str] = []
    reader = ScriptedModel([call(FINAL_TOOL, **a) for a in (reads or READ)])
    pm = PlanMode(ScriptedModel([f"```python\n{program}\n```"]), bank(log), reader=reader, approver=approver,
                  max_attempts=1)
    return pm.run("Pay my invoices."), log, reader


def test_a_plans_approvals_are_one_question_and_each_answer_is_used_for_its_call() -> None:
    approver = Batcher()
    result, log, reader = run(PAYS, approver)
    assert result.completed and approver.single == []
    assert len(approver.questions) == 1 and [r.arguments["recipient"] for r in approver.questions[0].requests] == \
        ["A1", "B2", "C3"]
    assert "3 payments" in approver.questions[0].summary
    # the reads before the first effect and the reader's answer are shared with the real pass, not redone
    assert log == ["read", "sent A1 10", "sent B2 10", "sent C3 10"] and len(reader.requests) == 1
    assert [c.decision for c in result.calls] == ["allow", "approved", "approved", "approved"]


def test_a_call_the_batch_denied_fails_the_plan_there_and_the_budget_counts_the_batch_once() -> None:
    approver = Batcher(refuse="B2")
    result, log, _ = run(PAYS, approver)
    assert not result.completed and approver.single == [] and log == ["read", "sent A1 10"]
    assert "send_money was not approved" in result.errors[0]
    approver = Batcher()
    log2: list[str] = []
    reader = ScriptedModel([call(FINAL_TOOL, **READ[0])])
    pm = PlanMode(ScriptedModel([f"```python\n{PAYS}\n```"]), bank(log2), reader=reader, approver=approver,
                  max_attempts=1, max_approvals=1)
    assert pm.run("Pay my invoices.").completed  # three calls, one question: within a budget of one


def test_a_call_that_depends_on_an_effect_asks_on_its_own() -> None:
    program = ('inv = read_invoices()\nrows = extract("the payments", inv, {"recipients": "list[str]"})\n'
               'r = send_money(recipient=rows["recipients"][0], amount=10)\n'
               'if r == "sent":\n    send_money(recipient=rows["recipients"][1], amount=20)\n'
               'send_money(recipient=rows["recipients"][2], amount=30)\nfinal_answer("paid")')
    approver = Batcher()
    result, log, _ = run(program, approver)
    assert result.completed and log == ["read", "sent A1 10", "sent B2 20", "sent C3 30"]
    assert [r.arguments["recipient"] for r in approver.questions[0].requests] == ["A1", "C3"]
    assert [r.arguments["recipient"] for r in approver.single] == ["B2"]  # under the payment's result


def test_an_approver_without_batches_is_asked_call_by_call_and_nothing_is_read_twice() -> None:
    approver = OneByOne()
    result, log, reader = run(PAYS, approver)
    assert result.completed and len(approver.single) == 3 and log.count("read") == 1 and len(reader.requests) == 1
