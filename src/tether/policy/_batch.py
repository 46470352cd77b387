"""Batched approvals: the calls one model turn announced that each need a person's approval are asked
about as one question (a summary of the group, each call shown), counted once by the approval budget.

The answer is recorded per call, bound to that call's exact action key and used once, in this turn:
the call then goes through the policy as usual and finds its decision. A call not in the group still
asks; an approver without `request_batch` is asked once per call, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tether._errors import OperationFailed
from tether._types import ToolCall
from tether.policy._approvals import (
    SUMMARY_KEY,
    ApprovalBatch,
    ApprovalDecision,
    ApprovalRequest,
    asks_in_batches,
    batch_summary,
)
from tether.policy._calls import _describe, _dry_run, plain_args
from tether.policy._canonical import action_key
from tether.policy._guard import CallView
from tether.tools._base import Tool
from tether.tools._executor import CallContext

if TYPE_CHECKING:
    from tether.policy._policy import SafetyPolicy
    from tether.policy._state import PolicyState


def forget_batches(state: PolicyState) -> None:
    """A new turn: the last turn's batches are over (an earlier turn's batch answer is for that turn's
    calls only)."""
    if state.batched:
        state.batched.clear()
    if state.decisions:
        for key in [k for k, d in state.decisions.items() if d.get("batch")]:
            del state.decisions[key]


async def announce_turn(policy: SafetyPolicy, calls: list[tuple[Tool, dict[str, Any], ToolCall]],
                        ctx: CallContext) -> list[dict[str, Any]]:
    """Ask once about the turn's calls that need approval (two or more); returns the decisions taken
    (`call_id`, `approved`, `by`, `batch`), empty when nothing was asked now."""
    from tether.policy._state import PolicyState

    state = ctx.policy_state if type(ctx.policy_state) is PolicyState else policy._state(ctx)
    forget_batches(state)
    if len(calls) < 2:
        return []
    group: list[CallView] = []
    for tool, args, call in calls:
        c = CallView(tool, call, ctx, state, args, plain_args(args), policy)
        if policy._checked(c) is not None or not c.ask:
            continue
        allows = getattr(policy.approver, "allows", None)
        if callable(allows) and allows(tool.name, c.args):
            continue  # an allow rule approves it: nobody is asked
        c.key = action_key(tool.name, c.args)
        if c.key in state.decisions or any(g.key == c.key for g in group):
            continue  # decided already; an identical call asks on its own (a repeat)
        group.append(c)
    if len(group) < 2:
        return []
    batch = f"{state.run_id}:{ctx.step}:batch"
    requests = tuple([ApprovalRequest(
        run_id=state.run_id, user=state.user, tool=c.tool.name, arguments=c.args, key=c.key,
        description=await _describe(c.tool, c.args), reason="; ".join(c.ask), effect=c.effect.value,
        provenance=c.prov, dry_run=await _dry_run(c.tool, c.args)) for c in group])
    declared = {c.tool.name: c.tool.metadata[SUMMARY_KEY] for c in group
                if isinstance(c.tool.metadata.get(SUMMARY_KEY), dict)}
    summary = batch_summary(requests, declared)
    for c in group:  # a pending call (the task service) is listed with its batch
        state.batched[c.call.id] = {"batch": batch, "batch_summary": summary}
    if not asks_in_batches(policy.approver) or policy._approval_budget_spent(state):
        return []  # asked call by call (the budget then stops them one by one)
    try:
        answers = list(await policy.approver.request_batch(ApprovalBatch(batch, requests, summary)))  # type: ignore[attr-defined]
        if len(answers) != len(requests):
            raise OperationFailed(f"{len(answers)} answers for {len(requests)} calls")
    except Exception as exc:  # a broken approver denies
        answers = [ApprovalDecision("denied", "error", f"approver failed: {type(exc).__name__}: {exc}")] * len(requests)
    decided = []
    for c, answer in zip(group, answers, strict=True):
        if answer.status == "pending":
            continue  # asked again by the call itself
        state.decisions[c.key] = {"approved": answer.approved, "by": answer.by, "reason": answer.reason,
                                  "call_id": c.call.id, "batch": batch}
        decided.append({"call_id": c.call.id, "approved": answer.approved, "by": answer.by, "batch": batch})
    return decided
