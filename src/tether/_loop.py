"""The loop: model, tool calls, executor, results, repeat, until an explicit stop reason.

Read `LoopRun` top to bottom: a run is a sequence of named steps (tether._steps: start, admit, call
model, plan calls, execute, observe, stop), each a method that returns the next node; `run_loop` drives
them to the end and `agent.iter()` (tether._iter) yields each node before it runs. Everything else here
is a small helper or a seam:
- `StepRunner` runs each model call and each tool call (durable mode swaps it for checkpointed steps);
- `ContextBuilder` decides what the model sees each turn (compaction slots in there).
Per-turn work is O(1) in the length of the history: the transcript is appended to, never re-walked.

Everything a run knows lives in its `RunState` (types.py); the loop is deterministic given the
outputs of its steps (clock readings come from the spec's clock, which the durable runner records),
so replaying the recorded steps takes the same branches, and the policy's checks and after-call
updates run here, in the workflow, from the recorded results.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from math import ceil
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast
from urllib.parse import urlsplit

from tether._admission import MIN_STEP_OUTPUT, Admission
from tether._errors import InvalidInput, OperationFailed, TetherError
from tether._json import dumps_fn
from tether._limits import LOST_CALL, Budget, Clock, Limits, LoopDetector, MonotonicClock
from tether._steps import Admit, CallModel, End, Execute, Observe, PlanCalls, Start, Step, StopRun
from tether._types import (
    APPROVAL_BUDGET_DECISION,
    NOTE_NAME,
    CallDecision,
    Message,
    ModelReply,
    ModelRequest,
    RunResult,
    RunState,
    StopReason,
    TextDelta,
    ToolCall,
    ToolResult,
    Usage,
)
from tether.events import (
    OBSERVERS,
    PREVIEW_CHARS,
    ApprovalDecided,
    ApprovalRequested,
    BaseEvent,
    Error,
    FilterVerdict,
    JobEnded,
    JobStarted,
    ModelCallEnded,
    ModelCallStarted,
    Notice,
    RunStarted,
    RunStopped,
    TextStreamed,
    ToolCallEnded,
    ToolCallStarted,
    TraceEvent,
)
from tether.models._base import Model
from tether.models._pricing import Pricing, charge, require_prices
from tether.tools._executor import (
    Bound,
    CallContext,
    Executor,
    Policy,
    PolicyBound,
    ToolCancelled,
    ToolStepFn,
)
from tether.tools._extra import RunFacts
from tether.tools._jobs import Jobs, is_job

if TYPE_CHECKING:
    from tether._output import OutputRun
    from tether.policy._safety_filter import SafetyFilter

EventSink = Callable[[TraceEvent], None]
T = TypeVar("T")


class StepRunner(Protocol):
    """Runs the side-effecting steps of a run; the durable runner checkpoints each one.

    `begin_turn` is told, in call order and before any of them runs, which calls of a turn will run
    (so concurrent steps get stable ids). `wait_approval` parks the run until a decision on one
    pending call arrives ({"call_id", "approved", "by", "reason"}); None means this runner cannot
    wait, and the run stops with `awaiting_approval`. `run_child` runs a sub-agent's run (or its
    next segment, after a decision) started by one of this run's tools: `run` runs it in memory; the
    durable runner instead runs it as a durable run of its own, under its parent, checkpointed step
    by step.
    """

    def begin_turn(self, step: int, indices: list[int]) -> None: ...

    async def run_child(self, parent_run_id: str, child: ChildRun,
                        run: Callable[[], Awaitable[RunResult[Any]]]) -> RunResult[Any]: ...

    async def model_step(self, step: int, run: Callable[[], Awaitable[ModelReply]]) -> ModelReply: ...

    async def tool_step(self, step: int, index: int, call: ToolCall,
                        run: Callable[[], Awaitable[ToolResult]]) -> ToolResult: ...

    async def wait_approval(self, run_id: str, pending: dict[str, Any]) -> dict[str, Any] | None: ...


class DirectStepRunner:
    """Runs steps in memory, as they come; cannot wait for an approval."""

    def begin_turn(self, step: int, indices: list[int]) -> None:
        return None

    async def run_child(self, parent_run_id: str, child: ChildRun,
                        run: Callable[[], Awaitable[RunResult[Any]]]) -> RunResult[Any]:
        return await run()  # in memory: the child's run is in the parent's trace and the tool's answer only

    async def model_step(self, step: int, run: Callable[[], Awaitable[ModelReply]]) -> ModelReply:
        return await run()

    async def tool_step(self, step: int, index: int, call: ToolCall,
                        run: Callable[[], Awaitable[ToolResult]]) -> ToolResult:
        return await run()

    async def wait_approval(self, run_id: str, pending: dict[str, Any]) -> dict[str, Any] | None:
        return None


class ContextBuilder(Protocol):
    """Chooses the messages the model sees; must not copy or re-walk the transcript per turn.

    `build` may be async (a compacting builder makes its own model call). Optional hooks: a builder
    with per-run state has `start(run: ContextRun) -> ContextBuilder`, called once per run, and the
    per-run builder may have `task_state() -> dict | None`, returned in `RunResult.task_state`.
    """

    def build(self, messages: list[Message]) -> list[Message] | Awaitable[list[Message]]: ...


class FullHistory:
    """The whole transcript, as is (no copy)."""

    def build(self, messages: list[Message]) -> list[Message]:
        return messages


class NotAdmitted(TetherError, RuntimeError):
    """A context builder's model call that could cross the run's token or cost ceiling (not sent)."""


class ContextRun:
    """What a context builder may use during one run: the spec, and `complete`, a model call that goes
    through the run's step runner (so durable mode records it), is priced, and counts against the budget."""

    __slots__ = ("_budget", "_emit", "spec")

    def __init__(self, spec: RunSpec, budget: Budget, emit: Callable[..., None]) -> None:
        self.spec = spec
        self._budget = budget
        self._emit = emit

    async def complete(self, request: ModelRequest, model: Model | None = None, purpose: str = "context") -> ModelReply:
        """One model call for the context builder; raises NotAdmitted, unsent, when it could cross a
        token or cost ceiling (its output is capped to what is left otherwise)."""
        use = model or self.spec.model
        if self._budget.limits.max_cost_usd is not None:
            require_prices(use, self.spec.pricing)
        admission = Admission(use, self.spec.pricing)
        stop, cap = admission.admit(self._budget, admission.count(request.messages, request.tools))
        if stop is not None:
            raise NotAdmitted(f"the {purpose} call was not sent: it could cross the run's {stop.value}")
        if cap is not None and (request.max_output_tokens is None or request.max_output_tokens > cap):
            request = replace(request, max_output_tokens=cap)
        started = self._budget.elapsed()
        self._emit(ModelCallStarted(model=use.name, messages=len(request.messages), purpose=purpose))
        reply = await _with_cancel(self.spec, self.spec.step_runner.model_step(
            self._budget.steps, lambda: use.complete(request)))
        _price(self.spec, reply, use)
        self._budget.record_model_call(reply.usage)
        self._emit(_model_call_ended(reply, use, "lost" if reply.finish_reason == LOST_CALL else purpose), started)
        if reply.finish_reason == LOST_CALL:  # sent before a crash, never recorded: charged, then admitted anew
            return await self.complete(request, model, purpose)
        return reply


async def _build(context: ContextBuilder, messages: list[Message]) -> list[Message]:
    built = context.build(messages)
    return built if isinstance(built, list) else await built


class CancelToken:
    """Cancels a run from outside: another task, a signal handler, the server, or another thread
    (a synchronous `agent.run()` waiting on a model call is woken at once). One token may serve
    runs on several event loops; once cancelled it stays cancelled."""

    __slots__ = ("_lock", "_set", "_waiters", "reason")

    def __init__(self) -> None:
        self._set = False
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if not self._set:
                self.reason = reason
            self._set = True
            waiters = list(self._waiters)
        for loop, event in waiters:  # each waiter on its own loop, thread-safely
            with contextlib.suppress(RuntimeError):  # that loop has closed: nothing waits there any more
                loop.call_soon_threadsafe(event.set)

    @property
    def cancelled(self) -> bool:
        return self._set

    async def wait(self) -> None:
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            if self._set:
                return
            self._waiters.append(entry)
        try:
            await entry[1].wait()
        finally:
            with self._lock:
                self._waiters.remove(entry)


class _Cancelled(TetherError):
    pass


RunCancelled = _Cancelled  # a step runner raises it when the run was cancelled from outside


class _Deadline:
    """One timer per run (not one per step): when the time budget, reserve excluded, runs out during
    a model call, that call is interrupted (the run's task is cancelled, then un-cancelled by `take`)."""

    __slots__ = ("armed", "fired", "handle", "task")

    def __init__(self, seconds: float | None) -> None:
        self.armed = False
        self.fired = False
        self.task = asyncio.current_task()
        self.handle = None if seconds is None else asyncio.get_running_loop().call_later(seconds, self._fire)

    def _fire(self) -> None:
        if self.armed and self.task is not None:
            self.fired = True
            self.task.cancel()

    def take(self) -> bool:
        """Whether the timer interrupted the call; if so the cancellation it caused is withdrawn."""
        if not self.fired:
            return False
        self.fired = False
        if self.task is not None:
            self.task.uncancel()
        return True

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()


@dataclass(slots=True)
class RunSpec:
    """Everything one run needs besides its transcript."""

    model: Model
    executor: Executor
    limits: Limits = field(default_factory=Limits)
    run_id: str = "run"
    user: str | None = None
    clock: Clock = field(default_factory=MonotonicClock)
    pricing: Pricing = field(default_factory=Pricing)
    step_runner: StepRunner = field(default_factory=DirectStepRunner)
    context: ContextBuilder = field(default_factory=FullHistory)
    cancel: CancelToken | None = None
    on_event: EventSink | None = None
    stream_text: bool = False
    input_filter: SafetyFilter | None = None  # screens the new request before any model call
    output_filter: SafetyFilter | None = None  # screens the final answer
    output: OutputRun | None = None  # the run's output type (tether._output), when it has one
    bounds: tuple[Bound, ...] = ()  # a sub-agent's: its ancestors' capabilities (tools.Bound)
    agent: str = ""  # the agent's name, for traces
    recovered: bool = False  # a durable run's workflow started again after its process stopped


DELEGATED_NAME = "delegated"  # a user-role task written by a tainted parent agent: counted as untrusted


@dataclass(slots=True, frozen=True)
class ChildRun:
    """A sub-agent's run as its parent starts it: the tool's name, the task, the child's state
    (fresh, or parked and now decided), its carved limits, and which segment this is (0, then one
    more each time it went on after a decision)."""

    name: str
    task: str
    state: RunState
    limits: Limits
    segment: int = 0


@dataclass(slots=True, frozen=True)
class ParentRun:
    """The running parent of a sub-agent: its budget (to carve from and charge), its taint, its
    sub-agent runs parked on an approval (`RunState.children`, by the parent's call id), how its
    runner runs a child (`StepRunner.run_child`, bound to the parent's run), and the capabilities
    every child call must also be within."""

    budget: Budget
    tainted: Callable[[], bool]
    children: dict[str, Any] = field(default_factory=dict)
    run_child: Callable[[ChildRun, Callable[[], Awaitable[RunResult[Any]]]], Awaitable[RunResult[Any]]] | None = None
    bounds: tuple[Bound, ...] = ()  # what its children's calls are checked against: its own and its ancestors'


def child_bounds(spec: RunSpec, ctx: CallContext | None = None) -> tuple[Bound, ...]:
    """What a sub-agent of this run is bound by: this run's bounds and its own policy's bound."""
    own = policy_bound(spec.executor.policy, ctx)
    return spec.bounds if own is None else (*spec.bounds, own)


def policy_bound(policy: Policy, ctx: CallContext | None = None) -> Bound | None:
    """A policy's bound on the sub-agents below its run (`Policy.bound_descendants`; a policy without
    that hook is bound through its `before_call`); None: it bounds nothing (`AllowAll`)."""
    hook = getattr(policy, "bound_descendants", None)
    return hook(ctx) if hook is not None else PolicyBound(policy, ctx)


FINAL_PROMPT = (
    "You have reached this run's limit ({reason}); no more tools can be used. Using only what you have "
    "found so far, write your best answer now. Say plainly what is unfinished or missing."
)


def new_state(spec: RunSpec, messages: list[Message]) -> RunState:
    """The state of a run that starts from `messages`."""
    return RunState(run_id=spec.run_id, user=spec.user, messages=messages)


async def run_loop(spec: RunSpec, state: RunState | list[Message], *, usage: Usage | None = None,
                   steps: int = 0) -> RunResult[Any]:
    """Run the agent loop over `state` (a RunState, or a transcript to start one from) and return how
    it ended. The state's transcript is appended to in place; `result.state` carries it on."""
    run = LoopRun(spec, state, usage=usage, steps=steps)
    node: Step = Start()
    steps_of = _STEPS
    # `run.next`, without its coroutine frame per step (five a turn): the same steps, the same handling;
    # a step that never awaits (planning the calls, observing their results) is called, not awaited
    while (kind := type(node)) is not End:
        if kind is StopRun:
            node = await run.stop(node)  # type: ignore[arg-type]
            continue
        try:
            if kind is PlanCalls:
                node = run.planned(node)  # type: ignore[arg-type]
            elif kind is Observe:
                node = run.observed(node)  # type: ignore[arg-type]
            else:
                node = await steps_of[kind](run, node)
        except (_Cancelled, asyncio.CancelledError):
            node = run.cancelled()
        except Exception as exc:
            node = run.failed(exc)
    return cast(End, node).result  # (End, by the loop's condition)


class LoopRun:
    """One run, step by step: `next(node)` runs one step and returns the next (see tether._steps).
    `run_loop` drives it to the end; `agent.iter()` yields each node before it runs. Every step reads
    and writes the RunState (and the budget over it), so stepping changes nothing."""

    __slots__ = ("admission", "answer", "budget", "calls", "context", "ctx", "deadline", "direct", "emit",
                 "emit_data", "found", "handles", "jobs", "loops", "messages", "pending", "policy", "spec", "state", "trace",
                 "under_way")

    def __init__(self, spec: RunSpec, state: RunState | list[Message], *, usage: Usage | None = None,
                 steps: int = 0) -> None:
        if not isinstance(state, RunState):
            state = new_state(spec, state)
            state.usage, state.steps = usage or Usage(), steps
        self.spec, self.state = spec, state
        self.messages = messages = state.messages
        self.budget = budget = Budget(spec.limits, spec.clock, state.usage, state.steps)
        self.loops = LoopDetector(spec.limits.max_repeats, state.loop_counts, state.loop_warned)
        trace: list[TraceEvent] = []
        self.trace = trace
        self.found: list[tuple[ToolCall, ToolResult]] = []  # rendered into findings once, at the end
        self.handles = handles = set(state.handles)
        self.ctx = ctx = CallContext(run_id=spec.run_id, user=spec.user, bounds=spec.bounds, run=RunFacts(
            # Once per run, not per step, for the policy's provenance: the user's own words, and the tool
            # outputs of earlier turns (a continued conversation stays as tainted as it was).
            user_messages=[m.content for m in messages
                           if m.role == "user" and m.name not in (NOTE_NAME, DELEGATED_NAME)],
            # a task another agent's model wrote after reading untrusted data is untrusted data too
            history_tool_outputs=[m.content for m in messages
                                  if m.role == "tool" or (m.role == "user" and m.name == DELEGATED_NAME)],
            handles=handles,
        ))
        # What a sub-agent started by one of this run's tools (tether._delegation) needs from its parent.
        ctx.run.parent = ParentRun(
            budget, lambda: bool(getattr(ctx.policy_state, "tainted", False)), state.children,
            lambda child, run: spec.step_runner.run_child(spec.run_id, child, run), child_bounds(spec, ctx))
        self.policy = spec.executor.policy
        self.answer = ""
        on_event = spec.on_event
        run_id = spec.run_id

        now, started = budget.now, budget.started  # budget.elapsed(), without its frame (four a turn)

        def emit(event: BaseEvent, since: float | None = None) -> None:
            """Stamp a typed event (`since`: its start; the duration ends now) and send its envelope."""
            event.step = budget.steps
            event.t = t = now() - started  # one clock reading for both
            if since is not None:
                event.duration = t - since
            envelope = event.envelope()
            trace.append(envelope)
            if on_event is not None:
                on_event(envelope)
            if OBSERVERS:  # telemetry, when enabled: nothing on the hot path otherwise
                _observe(run_id, event)

        def emit_data(kind: type[BaseEvent], name: str, data: dict[str, Any], since: float | None = None) -> None:
            """`emit(kind(**data))` for the events of every turn, their envelope built straight from
            `data` (`kind`'s payload, field for field, in order): the typed event is made only for
            telemetry observers, when there are any."""
            t = now() - started
            envelope = TraceEvent(name, budget.steps, t, 0.0 if since is None else t - since, data)
            trace.append(envelope)
            if on_event is not None:
                on_event(envelope)
            if OBSERVERS:
                _observe(run_id, kind(step=envelope.step, t=t, duration=envelope.duration, **data))

        self.emit = emit
        self.emit_data = emit_data
        # Background jobs (tether.tools._jobs), when the agent has a job tool; their records are the state's.
        self.jobs: Jobs | None = None
        if any(is_job(t) for t in spec.executor.tools.values()):
            def job_event(what: str, data: dict[str, Any]) -> None:
                emit(JobStarted(**data) if what == "started" else JobEnded(**data))

            self.jobs = ctx.run.jobs = Jobs(state.jobs, ledger=getattr(spec.step_runner, "job_ledger", None),
                                                   emit=job_event, seconds_left=budget.remaining_seconds)
        self.context: ContextBuilder = spec.context
        self.direct = type(spec.step_runner) is DirectStepRunner
        self.calls: list[ToolCall] = []  # the current turn's calls, answered in order
        self.pending: list[ToolResult | None] | None = None  # their results while they run
        self.under_way: list[bool] = []  # which of them were given to the executor (an unanswered one may have run)
        self.deadline = _Deadline(budget.remaining_seconds())
        # Token and cost ceilings: each call is sized and its output capped before it is sent.
        lim = spec.limits
        if lim.max_cost_usd is not None:  # a cost ceiling over a model with no price bounds nothing: refused
            require_prices(spec.model, spec.pricing)
        self.admission = Admission(spec.model, spec.pricing) \
            if lim.max_tokens is not None or lim.max_cost_usd is not None else None
        provider, server = model_origin(spec.model)
        emit(RunStarted(run_id=spec.run_id, user=spec.user,
                        resumed=spec.recovered or state.steps > 0 or bool(state.decisions),
                        agent=spec.agent, model=spec.model.name, provider=provider, server_address=server))

    async def next(self, node: Step) -> Step:
        """Run `node`'s step; the next node. A step that fails or is cancelled leads to StopRun, and StopRun to End."""
        kind = type(node)
        if kind is StopRun:
            return await self.stop(node)  # type: ignore[arg-type]
        if kind is End:
            raise InvalidInput("the run has ended: nothing follows its End")
        try:
            return await _STEPS[kind](self, node)
        except (_Cancelled, asyncio.CancelledError):
            return self.cancelled()
        except Exception as exc:  # a failing step runner, context builder, policy or event sink
            return self.failed(exc)

    def cancelled(self) -> StopRun:
        """The step was cancelled: the run stops, saying by whom."""
        spec = self.spec
        if spec.cancel is not None and spec.cancel.cancelled:
            error = spec.cancel.reason or "cancelled"
        else:  # its task was cancelled from outside (a process stopping), not the run: INTERRUPTED names it
            error = INTERRUPTED
        self.emit(Notice(notice={"cancelled": error}))
        return StopRun(StopReason.CANCELLED, error)

    def failed(self, exc: Exception) -> StopRun:
        """The step failed: the run stops with the error."""
        error = f"run failed: {type(exc).__name__}: {exc}"
        self.emit(Error(error=error))
        return StopRun(StopReason.ERROR, error)

    async def start(self, node: Start) -> Step:
        """The policy's state, the context builder's; decided approvals; the input filter."""
        spec, state = self.spec, self.state
        _start_policy(self.policy, state, self.ctx)
        start = getattr(spec.context, "start", None)  # a builder with per-run state
        if start is not None:
            self.context = start(ContextRun(spec, self.budget, self.emit))
        # a person decided on calls the run stopped for: those calls first (a sub-agent that needs
        # another decision parks the run again)
        if state.decisions and await _resume_decided(spec, state, self.ctx, self.budget, self.emit):
            return StopRun(StopReason.AWAITING_APPROVAL)
        if spec.input_filter is not None and (refused := _screen_input(spec, self.messages, self.emit)) is not None:
            self.answer = refused[0]
            return StopRun(StopReason.INPUT_REFUSED, refused[1])  # no model call at all
        return Admit()

    async def admit(self, node: Admit) -> Step:
        """1. Guards, before every model call; then the request, sized and capped within the ceilings."""
        spec, budget = self.spec, self.budget
        if spec.cancel is not None and spec.cancel.cancelled:
            raise _Cancelled
        stop = budget.exceeded()
        if stop is not None:
            return StopRun(stop)
        context = self.context
        if type(context) is FullHistory:  # its build returns the transcript as is
            built: Any = self.messages
        else:
            built = context.build(self.messages)
            if not isinstance(built, list):  # an async builder (e.g. compaction)
                built = await built
        request = ModelRequest(built, spec.executor.specs_for(bool(self.handles)))
        if spec.output is not None:
            request = spec.output.prepare(spec.model, request)
        admission = self.admission
        if admission is None:
            return CallModel(request)
        counted = admission.count(request.messages, request.tools)
        # `admission.admit(budget, counted)`, its frame less a step
        stop, cap = budget.admit(ceil(counted * admission.factor), admission.rates, min_output=MIN_STEP_OUTPUT)
        if stop is not None:
            self.emit(Notice(notice={"not_sent": stop.value, "input_tokens": counted}))
            return StopRun(stop)
        if cap is not None:
            request.max_output_tokens = min(cap, request.max_output_tokens or cap)
        return CallModel(request, counted)

    async def call_model(self, node: CallModel) -> Step:
        """2. The model, bounded by the time left (the final call's reserve excluded)."""
        spec, budget, emit, deadline, request = self.spec, self.budget, self.emit, self.deadline, node.request
        started = budget.now() - budget.started  # (budget.elapsed(), one frame less)
        self.emit_data(ModelCallStarted, "model_call_started",
                       {"model": spec.model.name, "messages": len(request.messages), "purpose": "step"})
        deadline.armed = True
        try:
            if self.direct:  # DirectStepRunner.model_step only awaits the call
                work = _call_model(spec, request, emit)
            else:
                work = spec.step_runner.model_step(budget.steps, partial(_call_model, spec, request, emit))
            reply = await (work if spec.cancel is None else _with_cancel(spec, work))
        except _Cancelled:
            raise
        except asyncio.CancelledError:
            if not deadline.take():
                raise
            emit(Notice(notice={"model_call_abandoned": StopReason.TIME_BUDGET.value}), started)
            return StopRun(StopReason.TIME_BUDGET)
        except Exception as exc:
            error = f"model call failed: {type(exc).__name__}: {exc}"
            emit(Error(error=error))
            return StopRun(StopReason.ERROR, error)
        finally:
            deadline.armed = False
        deadline.take()  # fired as the reply arrived (and the model swallowed it): the guard below decides
        reply.usage.cost_usd = charge(spec.pricing, spec.model, reply)  # (`_price`, one frame less a step)
        budget.record_model_call(reply.usage)
        if reply.finish_reason == LOST_CALL:  # sent before a crash, never recorded: charged, then admitted anew
            emit(_model_call_ended(reply, spec.model, "lost"), started)
            return Admit()
        if self.admission is not None:
            self.admission.observe(node.counted, reply.usage)
        self.messages.append(reply.to_message())
        if reply.text:
            self.answer = reply.text
        usage = reply.usage  # _model_call_ended(reply, spec.model, "step"), as its envelope's data
        self.emit_data(ModelCallEnded, "model_call", {
            "model": reply.model or spec.model.name, "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens, "cost_usd": usage.cost_usd, "tool_calls": len(reply.tool_calls),
            "text_chars": len(reply.text), "purpose": "step", "final": False, "finish_reason": reply.finish_reason,
        }, started)
        return PlanCalls(reply)

    async def plan_calls(self, node: PlanCalls) -> Step:
        """3. and 4. (see `planned`)."""
        return self.planned(node)

    def planned(self, node: PlanCalls) -> Step:
        """3. No tool calls: the model has answered. With an output type the answer must validate
        (tether._output): an invalid one goes back to the model with its errors, a bounded number of
        times, each retry a model call within the budget. But while a job the model has not seen is
        pending (docs/jobs.md), the run does not end with an answer that ignores it: the loop waits for
        the next job (a job_wait call added to the reply, no model call spent) and the model is asked
        again with its result.
        4. Never run a tool whose result no model call would read."""
        spec, reply, jobs = self.spec, node.reply, self.jobs
        if not reply.tool_calls and jobs is not None and (unseen := jobs.unseen()):
            wait = ToolCall(f"job_wait-{self.budget.steps}", "job_wait", {})
            self.messages[-1].tool_calls.append(wait)
            reply = replace(reply, tool_calls=[wait])
            self.emit(Notice(notice={"waiting_for_jobs": [r["id"] for r in unseen]}))
        if spec.output is not None and (verdict := spec.output.check(reply, self.messages)) != "tools":
            if verdict == "retry":
                self.emit(Notice(notice={"output_invalid": spec.output.errors}))
                return Admit()
            self.answer = spec.output.text
            return StopRun(StopReason.COMPLETED if verdict == "valid" else StopReason.OUTPUT_INVALID)
        calls = reply.tool_calls
        if not calls:
            return StopRun(StopReason.COMPLETED)
        stop = self.budget.exceeded()
        if stop is not None:
            _answer_turn(self.messages, calls, [None] * len(calls),
                         f"not run: the run reached its limit ({stop.value})")
            self.emit(Notice(notice={"skipped_calls": len(calls), "reason": stop.value}))
            return StopRun(stop)
        # from here the turn's calls are open: any stop answers each one (see `stop`)
        self.calls = calls
        pending: list[ToolResult | None] = [None] * len(calls)
        self.pending = pending
        self.under_way = [False] * len(calls)
        return Execute(calls)

    async def execute(self, node: Execute) -> Step:
        """5. The tools, concurrently, through the executor; results in call order."""
        spec, budget, ctx, calls = self.spec, self.budget, self.ctx, self.calls
        results, under_way = self.pending, self.under_way  # (read by `stop` if this turn is interrupted)
        assert results is not None
        ctx.step = budget.steps
        ctx.seconds_left = budget.remaining_seconds()
        work = _run_tools(spec, calls, results, ctx, budget, self.loops, self.emit, under_way, self.emit_data)
        stop = await (work if spec.cancel is None else _with_cancel(spec, work, spec.executor.cancel_grace))
        return Observe(calls, results, stop)

    async def observe(self, node: Observe) -> Step:
        """6. (see `observed`)."""
        return self.observed(node)

    def observed(self, node: Observe) -> Step:
        """6. Each call answered in the transcript, in call order; the policy's note on the turn."""
        calls, results = node.calls, node.results
        _answer_turn(self.messages, calls, results, "not run: the run is stopping")
        if (note := self.policy.label_turn(self.ctx.policy_state, [r for r in results if r is not None])):
            self.messages.append(Message("user", note, name=NOTE_NAME))
        found = self.found
        for c, r in zip(calls, results, strict=True):
            if r is not None and not r.is_error:
                found.append((c, r))
        self.pending = None
        return Admit() if node.stop is None else StopRun(node.stop)

    async def stop(self, node: StopRun) -> End[Any]:
        """7. The end: open calls answered, the final answer (a budget or loop stop), the output
        filters, and everything the run knows back into its state (once, not per step)."""
        spec, state, budget, emit, ctx, policy = self.spec, self.state, self.budget, self.emit, self.ctx, self.policy
        messages, found, answer = self.messages, self.found, self.answer
        stop, error = node.reason, node.error
        self.deadline.close()
        if self.jobs is not None:  # a run that ends leaves no job running (a cancelled run's jobs are cancelled here)
            await self.jobs.close(spec.executor.cancel_grace)
        if (pending := self.pending) is not None:
            # Interrupted mid-turn: keep the results that came back (a cancelled call's says whether it
            # finished), answer the rest, so the transcript stays valid for every provider (each call
            # answered once, in order).
            self.pending = None
            found.extend((c, r) for c, r in zip(self.calls, pending, strict=True) if r is not None and not r.is_error)
            why = "cancelled" if stop is StopReason.CANCELLED else "stopped by an error"
            _answer_turn(messages, self.calls, pending, f"not run: the run was {why}", self.under_way,
                         f"not finished: the run was {why} while it ran (whether it took effect is not known)")

        # A budget or loop stop: one reserved tool-free call writes the best partial answer.
        if stop not in _NO_FINAL_ANSWER and spec.limits.final_answer:
            answer = await _final_answer(spec, self.context, messages, stop, budget, emit, self.admission,
                                         [*state.findings, *(_finding(c, r) for c, r in found)]) or answer

        # The answer leaves the run through the policy's output filter (secrets, exfiltration links).
        if answer:
            answer, redacted = policy.finish_run(ctx.policy_state, answer)
            if redacted:
                emit(Notice(notice={"redacted": [f"{f.kind}: {f.reason}" for f in redacted]}))

        output: object = answer if stop is StopReason.COMPLETED else None  # without an output type: the text
        if spec.output is not None:
            stop, error, output = spec.output.finish(stop, error, answer)
        if answer and spec.output_filter is not None and stop is not StopReason.INPUT_REFUSED:
            answer, stop, error, output = _screen_output(spec, answer, stop, error, output, budget, emit)

        # Everything the run knows goes back into its state.
        state.findings.extend([_finding(c, r) for c, r in found])  # (a generator: one resume per call)
        state.usage, state.steps = budget.finish(), budget.steps
        state.loop_warned = sorted(self.loops.warned)
        state.handles = sorted(self.handles)
        state.stop_reason = stop
        state.task_state = _task_state(self.context) or state.task_state  # the context layer's slot
        if ctx.policy_state is not None:
            state.policy = policy.dump_state(ctx.policy_state)
        state.tainted = bool(getattr(ctx.policy_state, "tainted", False))  # a policy's state may not know taint
        state.pending = [] if stop is not StopReason.AWAITING_APPROVAL else [
            *({**p, "step": ctx.step} for p in (policy.pending(ctx.policy_state) if ctx.policy_state is not None else ())),
            *_children_pending(state.children, ctx.step)]
        result = RunResult(
            run_id=spec.run_id, stop_reason=stop, answer=answer, findings=list(state.findings),
            usage=state.usage, messages=messages, trace=self.trace, error=error, steps=budget.steps,
            task_state=state.task_state, output=output, state=state,
        )
        emit(RunStopped(stop_reason=result.stop_reason.value, steps=result.steps))
        return End(result)


_STEPS: dict[type, Callable[[LoopRun, Any], Awaitable[Step]]] = {
    Start: LoopRun.start, Admit: LoopRun.admit, CallModel: LoopRun.call_model, PlanCalls: LoopRun.plan_calls,
    Execute: LoopRun.execute, Observe: LoopRun.observe,
}
# stops that end without the reserved final-answer call
_NO_FINAL_ANSWER = frozenset((StopReason.COMPLETED, StopReason.ERROR, StopReason.CANCELLED,
                              StopReason.AWAITING_APPROVAL, StopReason.OUTPUT_INVALID, StopReason.INPUT_REFUSED))


REFUSED_ANSWER = "I can't help with this request: the input filter refused it ({reasons}). Nothing was sent to the model."
WITHHELD_ANSWER = "[The answer was withheld by the output filter: {reasons}.]"


def _screen_input(spec: RunSpec, messages: list[Message], emit: Callable[..., None]) -> tuple[str, str] | None:
    """The input filter's verdict on the run's new request (the last message, when the user wrote
    it); refused: (answer, error), and the request leaves the transcript so no later turn sends it."""
    last = messages[-1] if messages else None
    if spec.input_filter is None or last is None or last.role != "user" or last.name in (NOTE_NAME,):
        return None
    verdict = spec.input_filter.check(last.content)
    emit(FilterVerdict(side="input", score=verdict.score, threshold=verdict.threshold, flagged=verdict.flagged,
                       reasons=list(verdict.reasons), matched=list(verdict.matched), cached=verdict.cached))
    if not verdict.flagged:
        return None
    messages.pop()
    reasons = "; ".join(verdict.reasons)
    return REFUSED_ANSWER.format(reasons=reasons), f"refused by the input filter: {reasons}"


def _screen_output(spec: RunSpec, answer: str, stop: StopReason, error: str | None, output: object, budget: Budget,
                   emit: Callable[..., None]) -> tuple[str, StopReason, str | None, object]:
    """The output filter's verdict on the answer leaving the run: withheld (with the matched rules'
    reasons) when flagged; a completed run then stops `output_refused`. A rule that fails withholds too."""
    assert spec.output_filter is not None
    started = budget.elapsed()
    try:
        verdict = spec.output_filter.check(answer)
    except Exception as exc:  # a user's rule: the answer does not leave unchecked
        why = f"output filter failed: {type(exc).__name__}: {exc}"
        emit(Error(error=why))
        return WITHHELD_ANSWER.format(reasons=why), StopReason.ERROR, why, None
    emit(FilterVerdict(side="output", score=verdict.score, threshold=verdict.threshold, flagged=verdict.flagged,
                       reasons=list(verdict.reasons), matched=list(verdict.matched), cached=verdict.cached), started)
    if not verdict.flagged:
        return answer, stop, error, output
    reasons = "; ".join(verdict.reasons)
    if stop is StopReason.COMPLETED:
        stop, error = StopReason.OUTPUT_REFUSED, f"the output filter withheld the answer: {reasons}"
    return WITHHELD_ANSWER.format(reasons=reasons), stop, error, None


def _call_model(spec: RunSpec, request: ModelRequest, emit: Callable[..., None]) -> Awaitable[ModelReply]:
    if not spec.stream_text:
        return spec.model.complete(request)  # the model's own coroutine: no extra frame per call
    return _stream_model(spec, request, emit)


async def _stream_model(spec: RunSpec, request: ModelRequest, emit: Callable[..., None]) -> ModelReply:
    final: ModelReply | None = None
    async for item in spec.model.stream(request):
        if isinstance(item, TextDelta):
            emit(TextStreamed(text=item.text))
        else:
            final = item
    if final is None:
        raise OperationFailed(f"model {spec.model.name} ended its stream without a reply")
    return final


async def _with_cancel(spec: RunSpec, work: Awaitable[T], grace: float | None = None) -> T:
    """Await `work`, abandoning (cancelling) it if the run is cancelled meanwhile. With `grace` (a
    turn's tools), the cancelled work is awaited until it ends (a bounded wait, see `_let_end`), so
    each call's answer says what happened (a sync tool gets its cancel signal and `grace` seconds)."""
    if spec.cancel is None:
        return await work
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(spec.cancel.wait())
    stopped = False
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this task itself is cancelled: leave no orphaned work behind
        waiter.cancel()
        if not task.done():
            stopped = True
            task.cancel()
            if grace is not None:
                await _let_end([task], grace)
    if stopped or task.cancelled() or not task.done():
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the run is cancelled whatever the work ended with
        raise _Cancelled
    return task.result()


ABANDON_SECONDS = 1.0  # past the executor's grace: work that ignores its cancellation is abandoned


async def _let_end(tasks: Sequence[asyncio.Future[Any]], grace: float) -> None:
    """Wait for cancelled work to end, so every call gets its answer (a sync tool's thread is given
    the executor's `grace`); work still running `ABANDON_SECONDS` later ignored its cancellation."""
    running = [t for t in tasks if not t.done()]
    if not running:
        return
    try:
        await asyncio.wait(running, timeout=grace + ABANDON_SECONDS)
    except asyncio.CancelledError:  # cancelled again (a second Ctrl-C): stop waiting for threads too
        for task in running:
            task.cancel()
        raise


async def _run_tools(
    spec: RunSpec,
    calls: list[ToolCall],
    results: list[ToolResult | None],
    ctx: CallContext,
    budget: Budget,
    loops: LoopDetector,
    emit: Callable[..., None],
    under_way: list[bool],
    emit_data: Callable[..., None],
) -> StopReason | None:
    """Apply the per-call guards, run what may run (concurrently, bounded); `results[i]` is filled
    in place as call `i` finishes (or is cancelled: `ToolCancelled` carries its answer), so an
    interrupted turn keeps what came back; `under_way[i]` is set once call `i` is given to the executor."""
    stop: StopReason | None = None
    to_run: list[int] = []
    left = budget.tool_calls_left()
    for i, call in enumerate(calls):
        # waiting on a job again is progress, not a loop
        verdict = loops.check(call.name, call.arguments) if call.name != "job_wait" else "run"
        if verdict == "stop":
            stop = StopReason.LOOP_DETECTED
            results[i] = ToolResult(call.id, call.name, "ERROR: repeated identical call; the run is stopping.",
                                    is_error=True, decision=CallDecision.LOOP_DETECTED)
        elif verdict == "warn":
            results[i] = ToolResult(call.id, call.name, loops.observation(call.name), is_error=True,
                                    decision=CallDecision.REPEAT_SUPPRESSED)
        elif left is not None and len(to_run) >= left:
            results[i] = ToolResult(call.id, call.name, "ERROR: not run: the run's tool-call budget is used up.",
                                    is_error=True, decision=CallDecision.TOOL_CALL_BUDGET)
        else:
            to_run.append(i)
    if stop is not None and not spec.limits.final_answer:
        to_run = []  # the run stops after this turn and no final call would read these results

    runner = spec.step_runner
    direct = type(runner) is DirectStepRunner  # its tool_step only awaits: the executor's own default

    def step_of(i: int) -> ToolStepFn:
        return lambda work: runner.tool_step(ctx.step, i, calls[i], work)

    async def one(i: int) -> None:
        call = calls[i]
        started = budget.now() - budget.started  # (budget.elapsed(), one frame less)
        emit_data(ToolCallStarted, "tool_call_started",
                  {"name": call.name, "call_id": call.id, "arguments": call.arguments, "index": i})
        under_way[i] = True
        try:
            if direct:
                result = await spec.executor.execute(call, ctx, i)
            else:
                result = await spec.executor.execute(call, ctx, i, step_of(i))
        except ToolCancelled as cancelled:  # its answer says whether it finished after the cancel
            results[i] = cancelled.result
            emit(_tool_call_ended(call, cancelled.result), started)
            raise
        results[i] = result
        content = result.content  # `_tool_call_ended(call, result)`'s payload, as its envelope's data
        emit_data(ToolCallEnded, "tool_call", {
            "name": call.name, "call_id": call.id, "arguments": call.arguments, "decision": result.decision,
            "is_error": result.is_error, "result_chars": result.full_chars or len(content),
            "truncated": result.handle is not None, "preview": content[:PREVIEW_CHARS], "handle": result.handle,
        }, started)
        if result.decision == CallDecision.AWAITING_APPROVAL:
            if result.parked is not None:  # a sub-agent waits: kept in the run's state, by this call
                _children(ctx)[call.id] = result.parked
            batch, summary = _batch_of(spec, ctx, call.id)
            emit(ApprovalRequested(call_id=call.id, tool=call.name, arguments=call.arguments, reason=result.content,
                                   batch=batch, batch_summary=summary))

    if to_run:  # the calls that need approval: one question for the group (tether.policy._batch)
        for d in await spec.executor.announce(list(map(calls.__getitem__, to_run)), ctx):
            emit(ApprovalDecided(call_id=str(d["call_id"]), approved=bool(d["approved"]), by=str(d["by"]),
                                 batch=str(d["batch"])))
    if not direct:  # (DirectStepRunner.begin_turn does nothing)
        runner.begin_turn(ctx.step, to_run)
    if len(to_run) == 1:
        await one(to_run[0])
    elif to_run:
        limit = asyncio.Semaphore(spec.limits.max_parallel_tools)

        async def bounded(i: int) -> None:
            async with limit:
                await one(i)

        tasks = [asyncio.ensure_future(bounded(i)) for i in to_run]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # one failed (or the turn was cancelled): stop the others too, and let each answer
            for task in tasks:
                if not task.cancelling():  # once: a second cancel cuts a sync tool's grace short
                    task.cancel()
            await _let_end(tasks, spec.executor.cancel_grace)
            raise
    budget.usage.tool_calls += len(to_run)

    # Calls that await approval, one at a time in call order (a durable run parks here, holding no
    # thread, until another process decides; then that exact call runs, or the denial is its answer).
    asked = False  # only calls that ran can await approval
    for i in to_run:
        while (result := results[i]) is not None and result.decision == CallDecision.AWAITING_APPROVAL:
            asked = True
            with_batch = ctx.run.batch_decided.pop(calls[i].id, None)  # decided with an earlier call
            decisions = [with_batch] if with_batch is not None else await _wait_approvals(spec, calls[i], result, ctx)
            if decisions is None:
                break  # this runner cannot wait: the run stops awaiting approval
            for decision in decisions:
                emit(ApprovalDecided(call_id=str(decision["call_id"]), approved=bool(decision.get("approved")),
                                     by=str(decision.get("by") or ""), batch=str(decision.get("batch") or "")))
            await one(i)  # that exact call again: it runs, or its denial is its answer
        else:
            continue
        break

    if stop is None:
        parked = spent = False  # a call of the turn awaits approval; one met the approval budget
        for r in results:
            if r is not None:
                if r.decision == CallDecision.AWAITING_APPROVAL:
                    parked = True
                elif r.decision == APPROVAL_BUDGET_DECISION:
                    spent = True
        if asked and parked:
            stop = StopReason.AWAITING_APPROVAL
        elif spent:
            stop = StopReason.APPROVAL_BUDGET  # a run that keeps asking (or being denied) ends, with a partial answer
    return stop


def _children(ctx: CallContext) -> dict[str, Any]:
    """The run's sub-agents parked on an approval (`RunState.children`), by the parent's call id."""
    parent = ctx.run.parent
    assert parent is not None
    return parent.children


async def _wait_approvals(spec: RunSpec, call: ToolCall, result: ToolResult, ctx: CallContext) -> list[dict[str, Any]] | None:
    """Park until decisions on `call` arrive, each given to whoever asked: the policy, or the parked
    sub-agent (one decision per call it waits on, "CALL/CHILD_CALL"). None when the runner cannot
    wait or the policy cannot take decisions out of process: the run then stops awaiting approval."""
    child = _children(ctx).get(call.id)
    if child is None and ctx.policy_state is None:
        return None
    if child is None:
        waiting = spec.executor.policy.pending(ctx.policy_state)
        mine = [p for p in waiting if p.get("call_id") == call.id]
        pending = mine[0] if mine else {"call_id": call.id, "tool": call.name, "arguments": call.arguments,
                                        "reason": result.content}
        if pending.get("batch"):  # the whole group, so the person sees (and may answer) it at once
            pending = {**pending, "batch_calls": [p for p in waiting if p.get("batch") == pending["batch"]]}
        asked = [{**pending, "step": ctx.step}]
    else:
        asked = _children_pending({call.id: child}, ctx.step)
    decided = []
    for pending in asked:
        decision = await spec.step_runner.wait_approval(spec.run_id, pending)
        if decision is None:
            return None
        decided.append(d := {**decision, "call_id": pending["call_id"]})
        for other in _apply_decision(spec, ctx, d)[1:]:  # one answer for a batch: its other calls run after
            ctx.run.batch_decided[other] = {**d, "call_id": other}
    return decided


def _batch_of(spec: RunSpec, ctx: CallContext, call_id: str) -> tuple[str, str]:
    """The batch a pending call was asked about with and its summary ("", "" when none)."""
    if ctx.policy_state is None:
        return "", ""
    with contextlib.suppress(Exception):
        for p in spec.executor.policy.pending(ctx.policy_state):
            if p.get("call_id") == call_id and p.get("batch"):
                return str(p["batch"]), str(p.get("batch_summary") or "")
    return "", ""


def _apply_decision(spec: RunSpec, ctx: CallContext, d: dict[str, Any]) -> list[str]:
    """Give one decision to whoever asked: a parked sub-agent ("CALL/CHILD_CALL": its state keeps it
    for when the call runs again) or the policy (bound to that call's tool and arguments; with
    `batch`, to every pending call of that batch, each bound to its own). Returns the run's own
    calls to run again, the decided call first."""
    call_id = str(d["call_id"])
    head, _, child_call = call_id.partition("/")
    child = _children(ctx).get(head)
    if child_call and child is not None:
        child["state"].setdefault("decisions", []).append({**d, "call_id": child_call})
        return [head]
    if ctx.policy_state is None:
        raise InvalidInput("this run's policy takes no decisions on pending calls")
    policy = spec.executor.policy
    decide_batch: Any = getattr(policy, "decide_batch", None)
    if d.get("batch") and decide_batch is not None:
        ids: list[str] = decide_batch(ctx.policy_state, str(d["batch"]), bool(d.get("approved")),
                                      str(d.get("by") or "unknown"), str(d.get("reason") or ""))
        return [call_id, *(i for i in ids if i != call_id)]
    policy.decide(ctx.policy_state, call_id, bool(d.get("approved")), str(d.get("by") or "unknown"),
                  str(d.get("reason") or ""))
    return [call_id]


async def _resume_decided(spec: RunSpec, state: RunState, ctx: CallContext, budget: Budget,
                          emit: Callable[..., None]) -> bool:
    """Apply the decisions taken on a stopped run's pending calls (`RunState.approve`/`deny`): each
    goes to the policy, bound to its call's tool and arguments, and that exact call runs again
    through the executor (approved: it runs; denied: the denial is its answer), its result replacing
    the "awaiting approval" answer in the transcript, before the model is asked again. A decision on
    a sub-agent's call ("PARENT_CALL/CHILD_CALL") goes to the child's parked state, and the parent's
    call runs again to let the child go on. Returns whether a call parked again (the run stops)."""
    messages = state.messages
    turn = max((i for i, m in enumerate(messages) if m.role == "assistant" and m.tool_calls), default=None)
    steps = {p["call_id"]: p.get("step", budget.steps) for p in state.pending}
    rerun: dict[str, dict[str, Any]] = {}  # parent call id -> the decision that reruns it
    for d in state.decisions:
        for head in _apply_decision(spec, ctx, d):
            steps.setdefault(head, steps.get(d["call_id"], budget.steps))
            rerun.setdefault(head, {**d, "call_id": head} if d.get("batch") and head != d["call_id"] else d)
    parked = False
    for call_id, d in rerun.items():
        index, call = next(((k, c) for k, c in enumerate(messages[turn].tool_calls) if c.id == call_id)
                           if turn is not None else iter(()), (None, None))
        if call is None or index is None or turn is None:
            raise InvalidInput(f"call {call_id!r} is not in the run's last turn")
        ctx.step = steps.get(call_id, budget.steps)  # the call's own idempotency key: run:step:index
        started = budget.elapsed()
        emit(ToolCallStarted(name=call.name, call_id=call.id, arguments=call.arguments, index=index))
        slot = next(j for j in range(turn + 1, len(messages))
                    if messages[j].role == "tool" and messages[j].tool_call_id == call_id)
        try:
            result = await spec.step_runner.tool_step(ctx.step, index, call,
                                                      partial(spec.executor.execute, call, ctx, index))
        except ToolCancelled as cancelled:  # its answer replaces "awaiting approval" all the same
            messages[slot] = cancelled.result.to_message()
            raise
        budget.usage.tool_calls += 1
        if result.parked is not None:
            state.children[call_id] = result.parked
        messages[slot] = result.to_message()
        emit(ApprovalDecided(call_id=str(d["call_id"]), approved=bool(d["approved"]), by=str(d.get("by") or ""),
                             batch=str(d.get("batch") or "")))
        emit(_tool_call_ended(call, result), started)
        parked = parked or result.decision == CallDecision.AWAITING_APPROVAL
    state.decisions = []
    state.pending = []
    return parked


def _children_pending(children: dict[str, Any], step: int) -> list[dict[str, Any]]:
    """The calls parked sub-agents wait on, as the parent's pending calls ("PARENT_CALL/CHILD_CALL")."""
    return [{"call_id": f"{call_id}/{p['call_id']}", "tool": p.get("tool"), "arguments": p.get("arguments"),
             "reason": f"asked by the sub-agent '{child['agent']}': {p.get('reason', '')}", "agent": child["agent"],
             "provenance": p.get("provenance") or {},
             "step": step}
            for call_id, child in children.items() for p in child["state"].get("pending", ())]

def _start_policy(policy: Policy, state: RunState, ctx: CallContext) -> None:
    """The policy's per-run state on the CallContext: loaded from the RunState when the run has one
    (a resumed, continued or forked run is exactly as tainted as before), else started fresh."""
    if state.policy is not None:
        ctx.policy_state = policy.load_state(state.policy)
        if state.messages and state.messages[-1].role == "user":  # a continued conversation's new prompt
            policy.note_user(ctx.policy_state, state.messages[-1].content)
        return
    ctx.policy_state = policy.start_run(state.run_id, state.user, ctx.run.user_messages,
                                        ctx.run.history_tool_outputs)


async def _final_answer(spec: RunSpec, context: ContextBuilder, messages: list[Message], reason: StopReason,
                        budget: Budget, emit: Callable[..., None], admission: Admission | None,
                        findings: list[str]) -> str:
    """The one reserved, tool-free call that turns what was found into a partial answer. Under a
    token or cost ceiling it must fit what is left: when the whole transcript does not, it is sent
    the task and the findings, cut to fit; when nothing fits, the findings are the answer."""
    why = reason.value.replace("_", " ")
    messages.append(Message.user(FINAL_PROMPT.format(reason=why)))
    started = budget.elapsed()
    try:
        async with asyncio.timeout(budget.final_seconds()):
            # The tools stay declared, with tool choice "none": providers (Anthropic) refuse a history
            # holding tool calls from a request that declares no tools.
            tools = spec.executor.specs
            request = ModelRequest(await _build(context, messages), tools,
                                   max_output_tokens=budget.final_output_tokens(),
                                   tool_choice="none" if tools else None)
            if admission is not None:
                fitted = _fit_final(spec, admission, budget, request, messages, findings, why)
                if fitted is None:
                    emit(Notice(notice={"final_answer": "no model call fits what is left of the budget"}))
                    return _findings_answer(why, findings)
                request = fitted
            elif spec.output is not None:
                request = spec.output.prepare(spec.model, request)
            emit(ModelCallStarted(model=spec.model.name, messages=len(request.messages), purpose="final"))
            reply = await _with_cancel(spec, spec.step_runner.model_step(
                budget.steps, lambda: _call_model(spec, request, emit)))
    except _Cancelled:
        emit(Notice(notice={"cancelled": "final answer call"}))
        return ""
    except Exception as exc:
        emit(Error(error=f"final answer call failed: {type(exc).__name__}: {exc}"))
        return ""
    _price(spec, reply)
    budget.usage.add(Usage(reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cost_usd, 1,
                           cached_input_tokens=reply.usage.cached_input_tokens,
                           cache_write_tokens=reply.usage.cache_write_tokens))
    if reply.finish_reason == LOST_CALL:  # sent before a crash, never recorded: charged; the findings answer
        emit(_model_call_ended(reply, spec.model, "lost"), started)
        return _findings_answer(why, findings)
    messages.append(Message.assistant(reply.text))
    emit(_model_call_ended(reply, spec.model, "final"), started)
    return reply.text if spec.output is None else spec.output.accept_final(reply)


def _fit_final(spec: RunSpec, admission: Admission, budget: Budget, request: ModelRequest,
              messages: list[Message], findings: list[str], why: str) -> ModelRequest | None:
    """The final request, admitted (its output capped) within what is left of the ceilings: the whole
    transcript if it fits, else the instructions, the task and the findings cut until they fit."""
    def admitted(req: ModelRequest) -> ModelRequest | None:
        if spec.output is not None:
            req = spec.output.prepare(spec.model, req)
        stop, cap = admission.admit(budget, admission.count(req.messages, req.tools), final=True)
        if stop is not None:
            return None
        if cap is not None:
            req.max_output_tokens = min(cap, req.max_output_tokens or cap)
        return req

    if (whole := admitted(request)) is not None:
        return whole
    head = [m for m in messages[:1] if m.role == "system"]
    task = next((m.content for m in messages if m.role == "user" and m.name != NOTE_NAME), "")
    found = "\n".join(f"- {f}" for f in findings) or "(nothing yet)"
    room = 4_000
    while room >= 200:
        text = (f"The task: {_cut(task, room // 2)}\n\nWhat the run found so far:\n{_cut(found, room)}\n\n"
                + FINAL_PROMPT.format(reason=why))
        if (short := admitted(ModelRequest([*head, Message.user(text)], [],
                                           max_output_tokens=budget.final_output_tokens()))) is not None:
            return short
        room //= 2
    return None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " [...cut here]"


def _findings_answer(why: str, findings: list[str]) -> str:
    """The partial answer when no model call fits: what the run found, as found."""
    if not findings:
        return f"The run reached its limit ({why}) before it found anything."
    return f"The run reached its limit ({why}) before it could write an answer. What it found:\n" + "\n".join(
        f"- {f}" for f in findings)


def _model_call_ended(reply: ModelReply, model: Model, purpose: str) -> ModelCallEnded:
    return ModelCallEnded(model=reply.model or model.name, input_tokens=reply.usage.input_tokens,
                          output_tokens=reply.usage.output_tokens, cost_usd=reply.usage.cost_usd,
                          tool_calls=len(reply.tool_calls), text_chars=len(reply.text), purpose=purpose,
                          final=purpose == "final", finish_reason=reply.finish_reason)


# GenAI semantic conventions' provider names of tether's model adapters (by class: no import of them here)
_PROVIDERS = {"OpenAICompatModel": "openai", "AnthropicModel": "anthropic", "LocalModel": "tether.local",
              "ScriptedModel": "tether.scripted", "ReplayModel": "tether.scripted"}
INTERRUPTED = "interrupted"  # a cancelled run's reason when its process stopped it, not a person or a token


def model_origin(model: Model) -> tuple[str, str]:
    """A model's provider name (as the GenAI semantic conventions spell it; "" when unknown) and its
    server's host ("" when local), looking through wrappers (`.inner`) to the adapter."""
    for _ in range(4):
        provider = _PROVIDERS.get(type(model).__name__)
        if provider is not None:
            url = getattr(model, "base_url", None)
            return provider, (urlsplit(url).hostname or "") if isinstance(url, str) else ""
        inner = getattr(model, "inner", None)
        if inner is None:
            break
        model = inner
    return "", ""


def _tool_call_ended(call: ToolCall, result: ToolResult) -> ToolCallEnded:
    return ToolCallEnded(name=call.name, call_id=call.id, arguments=call.arguments, decision=result.decision,
                         is_error=result.is_error, result_chars=result.full_chars or len(result.content),
                         truncated=result.handle is not None, preview=result.content[:PREVIEW_CHARS],
                         handle=result.handle)


def _observe(run_id: str, event: BaseEvent) -> None:
    for observer in list(OBSERVERS):
        try:
            observer(run_id, event)
        except Exception:  # telemetry must never break a run: an observer that fails is dropped
            logging.getLogger(__name__).exception("event observer %r failed; it is removed", observer)
            with contextlib.suppress(ValueError):
                OBSERVERS.remove(observer)


def _price(spec: RunSpec, reply: ModelReply, model: Model | None = None) -> None:
    """The reply's cost (tether.models._pricing.charge): the highest of the asked model's price, the
    price of the model the reply names, and what the provider reported."""
    reply.usage.cost_usd = charge(spec.pricing, model or spec.model, reply)


def _task_state(context: ContextBuilder) -> dict[str, Any] | None:
    get = getattr(context, "task_state", None)
    return get() if get is not None else None


def _answer_turn(messages: list[Message], calls: list[ToolCall], results: list[ToolResult | None], why: str,
                 under_way: Sequence[bool] = (), why_under_way: str = "") -> None:
    """Append one tool message per call, in call order: its result, or an error saying `why` there is none
    (`why_under_way` for a call marked in `under_way`), so the transcript stays valid for every provider."""
    for i, (call, result) in enumerate(zip(calls, results, strict=True)):
        if result is not None:
            messages.append(result.to_message())
        else:
            text = why_under_way if i < len(under_way) and under_way[i] else why
            messages.append(Message("tool", f"ERROR: {text}", tool_call_id=call.id, name=call.name))


_args_json = dumps_fn(ensure_ascii=False)  # json.dumps(..., ensure_ascii=False, default=str), built once


def _finding(call: ToolCall, result: ToolResult) -> str:
    args = _args_json(call.arguments)
    if len(args) > 120:
        args = args[:117] + "..."
    text = result.content if len(result.content) <= 300 else result.content[:297] + "..."
    return f"{call.name}({args}) -> {text}"
