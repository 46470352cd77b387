"""Library approvals (issue 24, item 6): a run stopped `awaiting_approval` is answered with
`result.approve(call_id)` / `result.deny(call_id, reason)` and continued with
`agent.run(None, state=...)`; that exact call runs (or its denial is its answer), once."""

from __future__ import annotations

import json

import pytest
from test_policy_decisions import World

from tether import Agent, StopReason
from tether._types import RunState
from tether.models._scripted import ScriptedModel, call
from tether.policy import ApprovalBook, PendingApprover, SafetyPolicy


def _agent(world: World, script: list) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    policy = SafetyPolicy(approver=PendingApprover(ApprovalBook()))
    return Agent(model, tools=world.tools(), policy=policy), model


PAY = {"recipient": "ACME-IBAN-0001", "amount": 20}


def test_approve_from_the_result_runs_exactly_that_call_and_continues() -> None:
    world = World()
    agent, model = _agent(world, [call("read_email"), call("send_money", **PAY), "paid the invoice"])
    first = agent.run("pay the invoice in my email")
    assert first.stop_reason is StopReason.AWAITING_APPROVAL and world.sent == []
    [pending] = first.pending
    assert pending["tool"] == "send_money" and pending["arguments"]["amount"] == 20
    # the state goes through JSON (another process, days later) before the person answers
    state = RunState.from_json(first.state.to_json()).approve(pending["call_id"], by="alice")
    done = agent.run(None, state=state)
    assert done.stop_reason is StopReason.COMPLETED, done.error
    assert world.sent == [{**PAY, "note": ""}]
    assert done.answer == "paid the invoice"
    # the model saw the real result where "awaiting approval" was, and nothing else was asked
    tool_msgs = [m for m in model.requests[-1].messages if m.role == "tool"]
    assert tool_msgs[-1].content == "sent 20.0 to ACME-IBAN-0001"
    assert done.pending == []


def test_deny_from_the_result_answers_the_call_with_the_reason() -> None:
    world = World()
    agent, model = _agent(world, [call("read_email"), call("send_money", **PAY), "did not pay"])
    first = agent.run("pay the invoice in my email")
    done = agent.run(None, state=first.deny(first.pending[0]["call_id"], "not my landlord"))
    assert done.stop_reason is StopReason.COMPLETED and world.sent == []
    tool_msgs = [m for m in model.requests[-1].messages if m.role == "tool"]
    assert "not my landlord" in tool_msgs[-1].content


def test_an_approval_is_used_once_and_binds_to_its_arguments() -> None:
    world = World()
    agent, _ = _agent(world, [call("read_email"), call("send_money", **PAY),
                              call("send_money", **PAY), call("send_money", recipient="EVIL", amount=20), "x"])
    first = agent.run("pay the invoice in my email")
    second = agent.run(None, state=first.approve(first.pending[0]["call_id"]))
    # the repeat of the approved call asks again: one approval, one payment
    assert second.stop_reason is StopReason.AWAITING_APPROVAL
    assert world.sent == [{**PAY, "note": ""}]
    assert second.pending[0]["arguments"]["amount"] == 20


def test_bad_decisions_get_one_clear_error() -> None:
    world = World()
    agent, _ = _agent(world, [call("read_email"), call("send_money", **PAY)])
    first = agent.run("pay the invoice in my email")
    with pytest.raises(ValueError, match="no call 'nope' awaits a decision"):
        first.approve("nope")
    first.approve(first.pending[0]["call_id"])
    with pytest.raises(ValueError, match="already decided"):
        first.deny(first.pending[0]["call_id"])
    assert json.loads(first.state.to_json())["decisions"][0]["approved"] is True
