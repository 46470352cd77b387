"""`Agent`: the configuration of a run (model, tools, instructions, limits, policy). No loop logic here."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from typing_extensions import TypeVar

from tether._delegation import agent_as_tool, require_agent_prices
from tether._errors import InvalidInput, OperationFailed
from tether._iter import AgentRun
from tether._limits import Clock, Limits, MonotonicClock
from tether._loop import (
    CancelToken,
    ContextBuilder,
    DirectStepRunner,
    FullHistory,
    LoopRun,
    RunSpec,
    StepRunner,
    run_loop,
)
from tether._output import OutputRun, OutputType
from tether._types import Message, RunResult, RunState
from tether.events import TraceEvent
from tether.models._base import Model
from tether.models._pricing import Pricing
from tether.tools._base import Tool
from tether.tools._executor import Executor, Policy
from tether.tools._results import DEFAULT_MAX_RESULT_CHARS, Results

OutputT = TypeVar("OutputT", default=str)


@dataclass
class Agent(Generic[OutputT]):
    """A model with tools, bounded by limits.

    >>> agent = Agent(model, tools=[calculator], instructions="Be brief.", limits=Limits(max_steps=5))
    >>> result = agent.run("What is 17 * 23?")
    >>> result.stop_reason, result.answer

    `output_type` (a pydantic model, dataclass, TypedDict, primitive, list or union; see
    `tether._output`) makes `result.output` a validated value of that type; an invalid answer goes
    back to the model with its errors up to `output_retries` times.

    `input_filter` screens the request before any model call (refused: stop reason `input_refused`,
    no model call), `output_filter` the final answer (withheld: `output_refused`): each is a
    strictness ("lenient", "standard", "strict"), True (standard), a `tether.policy.SafetyFilter`, or a
    list of your own rules (regexes or functions of the text). Off by default; see docs/safety.md.
    """

    model: Model
    tools: Sequence[Tool] = ()
    instructions: str = ""
    limits: Limits = field(default_factory=Limits)
    policy: Policy | None = None  # None: tether.policy.SafetyPolicy() with a deny-all approver
    user: str | None = None
    pricing: Pricing = field(default_factory=Pricing)
    clock: Clock = field(default_factory=MonotonicClock)
    step_runner: StepRunner = field(default_factory=DirectStepRunner)
    context: ContextBuilder = field(default_factory=FullHistory)
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    tool_timeout: float | None = 120.0
    executor: Executor | None = None
    # where capped results are kept: a temporary file of this process by default; a RunStore (any
    # process, any Agent) lets a run continued from its state on another process page them
    results: Results | None = None
    durable: Any = None  # tether.durable.Durable (or a database path/URL): every step checkpointed
    name: str = "agent"  # identifies this agent's durable runs, so a restarted process can recover them
    output_type: type[OutputT] | None = None
    output_retries: int = 2
    input_filter: Any = None  # tether.policy.as_filter(..., "input"): None/False/"off" for none
    output_filter: Any = None
    _output: OutputType[Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.output_type is not None:
            self._output = OutputType.of(self.output_type)
        if self.input_filter is not None or self.output_filter is not None:
            from tether.policy._safety_filter import as_filter

            self.input_filter = as_filter(self.input_filter, "input")
            self.output_filter = as_filter(self.output_filter, "output")
        if self.output_retries < 0:
            raise InvalidInput(f"output_retries must be >= 0, got {self.output_retries}")
        if self.policy is None:
            from tether.policy import SafetyPolicy  # the default: deny-by-default approvals after taint

            self.policy = SafetyPolicy()
        if self.executor is None:
            from tether.values import with_query_tool  # + inspect_value, when a tool may hide its output

            self.executor = Executor(with_query_tool(self.tools, self.policy, self.model), policy=self.policy, max_result_chars=self.max_result_chars,
                                     default_timeout=self.tool_timeout, results=self.results,
                                     max_workers=max(8, self.limits.max_parallel_tools))
        if self.limits.max_cost_usd is not None:  # refused now, not after the money is spent
            require_agent_prices(self)
        if self.durable is False:  # durable=False reads as "not durable" (it made a durable agent before)
            self.durable = None
        if self.durable is not None:
            from tether.durable import attach  # only durable agents import DBOS

            self.durable = attach(self, self.durable)

    def as_tool(self, name: str, description: str = "", *, share: float = 0.5) -> Tool:
        """This agent as a tool of another: each call is one run of this agent on the task the parent's
        model writes, its token and cost budgets carved from what the parent has left (`share` of it,
        never more), its usage charged to the parent, acting as the parent's user, tainted when the
        parent is. See docs/agents.md."""
        return agent_as_tool(self, name, description, share=share)

    def start_messages(self, prompt: str) -> list[Message]:
        """The transcript a new run starts from: the instructions, then the prompt."""
        head = [Message.system(self.instructions)] if self.instructions else []
        return [*head, Message.user(prompt)]

    def state_from(self, messages: Iterable[Message], *, run_id: str = "") -> RunState:
        """A RunState holding only a bare transcript (earlier turns kept elsewhere, a chat's lines):
        continue it with `run(prompt, state=...)`. Unlike a run's own `result.state`, it knows no
        usage, loop counts or policy state: the budget starts afresh and the earlier tool outputs in
        it count as untrusted (the policy never saw where they came from)."""
        messages = list(messages)
        if self.instructions and not (messages and messages[0].role == "system"):
            messages.insert(0, Message.system(self.instructions))
        return RunState(run_id=run_id, user=self.user, messages=messages)

    def start_state(self, prompt: str | None, *, state: RunState | None = None, run_id: str) -> RunState:
        """The RunState a run starts from: a fresh one, or `state` carried forward (a continued
        conversation keeps its usage, steps, loop counts, taint and handles; `prompt` None resumes
        it without a new user turn). `state` is copied, never changed."""
        if state is None:
            if prompt is None:
                raise InvalidInput("a run needs a prompt, or a state to continue")
            return RunState(run_id=run_id, user=self.user, messages=self.start_messages(prompt))
        if state.user != self.user:
            raise InvalidInput(f"this RunState belongs to user {state.user!r}, not {self.user!r}")
        messages = list(state.messages)
        if prompt is not None:
            messages.append(Message.user(prompt))
        u = state.usage
        return RunState(
            run_id=run_id, user=state.user, messages=messages,
            usage=u.copy(),
            steps=state.steps, loop_counts=dict(state.loop_counts), loop_warned=list(state.loop_warned),
            findings=list(state.findings), policy=state.policy, handles=list(state.handles),
            task_state=state.task_state, pending=[dict(p) for p in state.pending],
            decisions=[dict(d) for d in state.decisions] if prompt is None else [],
            children=copy.deepcopy(state.children), jobs=copy.deepcopy(state.jobs),
        )

    def _spec(self, run_id: str, cancel: CancelToken | None, on_event: Callable[[TraceEvent], None] | None,
              stream_text: bool, limits: Limits | None = None) -> RunSpec:
        assert self.executor is not None
        return RunSpec(
            model=self.model, executor=self.executor, limits=limits or self.limits, run_id=run_id,
            user=self.user, clock=self.clock, pricing=self.pricing, step_runner=self.step_runner,
            input_filter=self.input_filter, output_filter=self.output_filter,
            context=self.context, cancel=cancel, on_event=on_event, stream_text=stream_text,
            output=None if self._output is None else OutputRun(self._output, self.output_retries), agent=self.name,
        )

    async def arun(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        run_id: str | None = None,
        cancel: CancelToken | None = None,
        on_event: Callable[[TraceEvent], None] | None = None,
        stream_text: bool = False,
        limits: Limits | None = None,
    ) -> RunResult[OutputT]:
        """Run to a stop reason. `state=result.state` continues a conversation with everything the
        run knew (budget, loop counts, taint, handles); a bare transcript continues through
        `state=agent.state_from(messages)`. `on_event` gets every event's envelope as it happens
        (`tether.events.typed` gives the typed event); `stream_text` adds the model's text deltas.
        `limits`: this run's limits instead of the agent's (not for a durable agent, whose recovered
        runs are rebuilt from the agent)."""
        run_id, start = self._begin(prompt, state, run_id, limits)
        if self.durable is not None:
            durable: RunResult[OutputT] = await self.durable.run(self, start, cancel=cancel, on_event=on_event,
                                                                 stream_text=stream_text)
            return durable
        return await run_loop(self._spec(run_id, cancel, on_event, stream_text, limits), start)

    def _begin(self, prompt: str | None, state: RunState | None, run_id: str | None,
               limits: Limits | None) -> tuple[str, RunState]:
        """A run's id and the state it starts from, once its limits are known to be usable."""
        run_id = run_id or uuid.uuid4().hex[:12]
        if limits is not None and self.durable is not None:
            raise InvalidInput("limits= on run() is not taken by a durable agent (a recovered run is rebuilt from "
                               "the agent): set Agent(limits=...)")
        if (limits or self.limits).max_cost_usd is not None:
            require_agent_prices(self)
        return run_id, self.start_state(prompt, state=state, run_id=run_id)

    def iter(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        run_id: str | None = None,
        cancel: CancelToken | None = None,
        on_event: Callable[[TraceEvent], None] | None = None,
        stream_text: bool = False,
        limits: Limits | None = None,
    ) -> AgentRun[OutputT]:
        """The run of `arun`, stepped by the caller: `async with agent.iter(prompt) as run: async for node
        in run: ...` yields each step (tether._steps: Start, Admit, CallModel, PlanCalls, Execute, Observe,
        Stop, End) before it runs; `run.result` is then what `arun` returns. Same arguments as `arun`.
        Not for a durable agent (its run is a workflow that recovers on its own)."""
        if self.durable is not None:
            raise InvalidInput("agent.iter() steps an in-memory run; a durable agent's run is a workflow that "
                               "recovers on its own: use agent.arun() or agent.stream()")
        run_id, start = self._begin(prompt, state, run_id, limits)
        spec = self._spec(run_id, cancel, on_event, stream_text, limits)
        return AgentRun(lambda: LoopRun(spec, start))

    def run(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        run_id: str | None = None,
        cancel: CancelToken | None = None,
        on_event: Callable[[TraceEvent], None] | None = None,
        stream_text: bool = False,
        limits: Limits | None = None,
    ) -> RunResult[OutputT]:
        """Synchronous `arun`: runs on its own event loop, and closes the model's connections before
        that loop ends. Inside a running event loop, `await agent.arun(...)` instead."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._run_closing(self.arun(prompt, state=state, run_id=run_id, cancel=cancel,
                                                           on_event=on_event, stream_text=stream_text,
                                                           limits=limits)))
        raise OperationFailed("Agent.run() was called inside a running event loop (Jupyter, an async server, "
                           "a coroutine): use `await agent.arun(...)` there")

    async def _run_closing(self, run: Awaitable[RunResult[OutputT]]) -> RunResult[OutputT]:
        try:
            return await run
        finally:
            close = getattr(self.model, "aclose", None)  # clients tied to this loop, which ends here
            if close is not None:
                await close()

    async def stream(
        self,
        prompt: str | None,
        *,
        state: RunState | None = None,
        run_id: str | None = None,
        cancel: CancelToken | None = None,
        stream_text: bool = True,
        limits: Limits | None = None,
    ) -> AsyncIterator[TraceEvent | RunResult[OutputT]]:
        """Yield each TraceEvent as it happens (text deltas too), then the RunResult."""
        queue: asyncio.Queue[TraceEvent | None] = asyncio.Queue()
        task = asyncio.ensure_future(self.arun(prompt, state=state, run_id=run_id, cancel=cancel,
                                               on_event=queue.put_nowait, stream_text=stream_text, limits=limits))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
            yield task.result()
        finally:
            if not task.done():
                task.cancel()
