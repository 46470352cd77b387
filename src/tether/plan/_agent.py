"""Plan mode as an agent: `PlanAgent` runs each request in plan mode (docs/plan-mode.md) wherever an
`Agent` runs, including durable runs and the task service.

Its planner and reader calls are model steps and its tool calls tool steps of the run's step runner,
so a durable run records each: a run killed and recovered replays them (the same plan, the same
results) and does not repeat an effect; each call has its own idempotency key (`run_id:N:0`, N its
number in the run). An approval parks the run through the step runner (`wait_approval`: the task
service's confirm, `tether approve`); a runner that cannot wait asks the agent's policy's approver.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from tether._agent import Agent
from tether._loop import DirectStepRunner, RunSpec, _tool_call_ended
from tether._types import (
    CallDecision,
    Message,
    ModelReply,
    ModelRequest,
    RunResult,
    RunState,
    StopReason,
    ToolCall,
    ToolResult,
)
from tether.events import (
    ApprovalDecided,
    ApprovalRequested,
    BaseEvent,
    RunStarted,
    RunStopped,
    ToolCallStarted,
)
from tether.models._base import Model
from tether.plan._policies import PlanPolicy
from tether.plan._runner import PlanMode, PlanResult
from tether.policy._approvals import ApprovalDecision, ApprovalRequest, Approver, DenyAll
from tether.tools._executor import CallContext, Executor

STOPS = {"completed": StopReason.COMPLETED, "approval_budget": StopReason.APPROVAL_BUDGET,
         "budget": StopReason.TOKEN_BUDGET, "plan_failed": StopReason.ERROR}


@dataclass
class PlanAgent(Agent[Any]):
    """An agent whose runs are in plan mode: its model writes the plan (and, without `reader`, reads
    untrusted text with no tools), its tools run through the plan's per-argument `policies`
    (`trusted_tools`: whose output counts as trusted). `max_attempts`: plans written per request."""

    reader: Model | None = None
    policies: dict[str, PlanPolicy] = field(default_factory=dict)
    trusted_tools: Iterable[str] = ()
    max_attempts: int = 3

    async def arun(self, prompt: str | None, *, state: RunState | None = None, run_id: str | None = None,
                   cancel: Any = None, on_event: Callable[..., None] | None = None, stream_text: bool = False,
                   limits: Any = None) -> RunResult[Any]:
        """As `Agent.arun`, in plan mode."""
        if self.durable is not None:
            return await super().arun(prompt, state=state, run_id=run_id, cancel=cancel, on_event=on_event,
                                      stream_text=stream_text, limits=limits)
        import uuid

        run_id = run_id or uuid.uuid4().hex[:12]
        start = self.start_state(prompt, state=state, run_id=run_id)
        return await run_plan(self._spec(run_id, cancel, on_event, stream_text, limits), start, self)

    async def run_steps(self, spec: RunSpec, state: RunState) -> RunResult[Any]:
        """One request in plan mode, its steps through `spec.step_runner` (the durable workflow runs a
        PlanAgent's requests through this instead of the ordinary loop)."""
        return await run_plan(spec, state, self)


async def run_plan(spec: RunSpec, state: RunState, agent: Agent[Any] | None = None) -> RunResult[Any]:
    """One request (the state's last user message) in plan mode, its steps through `spec.step_runner`."""
    runner = spec.step_runner
    events: list[Any] = []

    def emit(event: BaseEvent) -> None:
        event.step = state.steps
        envelope = event.envelope()
        events.append(envelope)
        if spec.on_event is not None:
            spec.on_event(envelope)

    request = next((m.content for m in reversed(state.messages) if m.role == "user"), "")
    emit(RunStarted(run_id=spec.run_id, user=spec.user, agent=spec.agent, model=getattr(spec.model, "name", "")))
    fallback = getattr(spec.executor.policy, "approver", None) or DenyAll()
    model_steps = itertools.count(1)
    mode = PlanMode(
        cast(Model, _Recorded(spec.model, runner, model_steps)), list(spec.executor.tools.values()),
        reader=cast(Model, _Recorded(getattr(agent, "reader", None) or spec.model, runner, model_steps)),
        policies=dict(getattr(agent, "policies", None) or {}), trusted_tools=tuple(getattr(agent, "trusted_tools", ())),
        approver=_Parking(spec, emit, fallback), max_attempts=int(getattr(agent, "max_attempts", 3)), user=spec.user,
        max_tokens=spec.limits.max_tokens, max_cost_usd=spec.limits.max_cost_usd)
    mode.executor = _Steps(mode.executor, spec, emit)  # type: ignore[assignment]  # duck-typed: execute, policy
    result: PlanResult = await mode.arun(request, run_id=spec.run_id)
    stop = STOPS.get(result.stop_reason, StopReason.ERROR)
    state.usage.add(result.usage)
    state.steps += len(result.plans) + len(result.calls)
    state.messages.append(Message("assistant", result.answer))
    state.stop_reason = stop
    emit(RunStopped(stop_reason=stop.value, steps=state.steps))
    return RunResult(spec.run_id, stop, result.answer, usage=state.usage.copy(), messages=state.messages,
                     trace=events, error=None if stop is not StopReason.ERROR else result.answer, steps=state.steps,
                     state=state)


class _Recorded:
    """A model whose calls are the run's model steps (recorded by a durable runner, replayed on recovery)."""

    def __init__(self, model: Model, runner: Any, steps: Iterable[int]) -> None:
        self.model = model
        self.runner = runner
        self.steps = iter(steps)

    async def complete(self, request: ModelRequest) -> ModelReply:
        reply: ModelReply = await self.runner.model_step(next(self.steps), lambda: self.model.complete(request))
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class _Steps:
    """The plan's executor, each call a tool step of the run (its result recorded; its idempotency key
    `run_id:N:0`, N its number in the run), with its events."""

    def __init__(self, executor: Executor, spec: RunSpec, emit: Callable[[BaseEvent], None]) -> None:
        self.executor = executor
        self.policy = executor.policy
        self.spec = spec
        self.emit = emit

    async def execute(self, call: ToolCall, ctx: CallContext) -> ToolResult:
        self.emit(ToolCallStarted(name=call.name, call_id=call.id, arguments=call.arguments))
        result = await self.spec.step_runner.tool_step(ctx.step, 0, call, lambda: self.executor.execute(call, ctx))
        self.emit(_tool_call_ended(call, result))
        return result


@dataclass
class _Parking:
    """The plan's approver: parks the run until a person decides (`wait_approval`); a runner that
    cannot wait asks `fallback` (the agent's policy's approver)."""

    spec: RunSpec
    emit: Callable[[BaseEvent], None]
    fallback: Approver
    asked: int = 0

    @property
    def asks_a_person(self) -> bool:
        return bool(getattr(self.fallback, "asks_a_person", True))

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        self.asked += 1
        call_id = f"plan{self.asked}"
        pending = {"call_id": call_id, "tool": req.tool, "arguments": req.arguments, "reason": req.reason,
                   "provenance": dict(req.provenance), "step": self.asked}
        decision = None
        if not isinstance(self.spec.step_runner, DirectStepRunner):  # it may park: the person is told now
            self.emit(_tool_call_ended(ToolCall(call_id, req.tool, req.arguments), ToolResult(
                call_id, req.tool, f"PENDING: '{req.tool}' awaits approval: {req.reason}", is_error=True,
                decision=CallDecision.AWAITING_APPROVAL)))
            self.emit(ApprovalRequested(call_id=call_id, tool=req.tool, arguments=req.arguments, reason=req.reason))
            decision = await self.spec.step_runner.wait_approval(self.spec.run_id, pending)
        if decision is None:
            return await self.fallback.request(dataclasses.replace(req))
        approved = bool(decision.get("approved"))
        self.emit(ApprovalDecided(call_id=call_id, approved=approved, by=str(decision.get("by") or "")))
        return ApprovalDecision("approved" if approved else "denied", str(decision.get("by") or ""),
                                str(decision.get("reason") or ""))
