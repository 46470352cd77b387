"""`Agent`: the configuration of a run (model, tools, instructions, limits, policy). No loop logic here."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from typing_extensions import TypeVar

from tether.limits import Clock, Limits, MonotonicClock
from tether.loop import (
    CancelToken,
    ContextBuilder,
    DirectStepRunner,
    FullHistory,
    RunSpec,
    StepRunner,
    run_loop,
)
from tether.models.base import Model
from tether.models.pricing import Pricing
from tether.output import OutputRun, OutputType
from tether.tools.base import Tool
from tether.tools.executor import Executor, Policy
from tether.tools.results import DEFAULT_MAX_RESULT_CHARS
from tether.types import Message, RunResult, TraceEvent

OutputT = TypeVar("OutputT", default=str)


@dataclass
class Agent(Generic[OutputT]):
    """A model with tools, bounded by limits.

    >>> agent = Agent(model, tools=[calculator], instructions="Be brief.", limits=Limits(max_steps=5))
    >>> result = agent.run("What is 17 * 23?")
    >>> result.stop_reason, result.answer

    `output_type` (a pydantic model, dataclass, TypedDict, primitive, list or union; see
    `tether.output`) makes `result.output` a validated value of that type; an invalid answer goes
    back to the model with its errors up to `output_retries` times.
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
    output_type: type[OutputT] | None = None
    output_retries: int = 2
    _output: OutputType[Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.output_type is not None:
            self._output = OutputType.of(self.output_type)
        if self.output_retries < 0:
            raise ValueError(f"output_retries must be >= 0, got {self.output_retries}")
        if self.policy is None:
            from tether.policy import SafetyPolicy  # the default: deny-by-default approvals after taint

            self.policy = SafetyPolicy()
        if self.executor is None:
            self.executor = Executor(self.tools, policy=self.policy, max_result_chars=self.max_result_chars,
                                     default_timeout=self.tool_timeout,
                                     max_workers=max(8, self.limits.max_parallel_tools))

    def start_messages(self, prompt: str, history: Iterable[Message] = ()) -> list[Message]:
        """The transcript a new run starts from: instructions, earlier turns, the prompt."""
        messages: list[Message] = []
        history = list(history)
        if self.instructions and not (history and history[0].role == "system"):
            messages.append(Message.system(self.instructions))
        messages.extend(history)
        messages.append(Message.user(prompt))
        return messages

    def _spec(self, run_id: str | None, cancel: CancelToken | None, on_event, stream_text: bool) -> RunSpec:
        assert self.executor is not None
        return RunSpec(
            model=self.model, executor=self.executor, limits=self.limits, run_id=run_id or uuid.uuid4().hex[:12],
            user=self.user, clock=self.clock, pricing=self.pricing, step_runner=self.step_runner,
            context=self.context, cancel=cancel, on_event=on_event, stream_text=stream_text,
            output=None if self._output is None else OutputRun(self._output, self.output_retries),
        )

    async def arun(
        self,
        prompt: str,
        *,
        history: Iterable[Message] = (),
        run_id: str | None = None,
        cancel: CancelToken | None = None,
        on_event=None,
        stream_text: bool = False,
    ) -> RunResult[OutputT]:
        """Run to a stop reason. `history` continues a conversation (e.g. `result.messages`)."""
        spec = self._spec(run_id, cancel, on_event, stream_text)
        return await run_loop(spec, self.start_messages(prompt, history))

    def run(self, prompt: str, **kwargs) -> RunResult[OutputT]:
        """Synchronous `arun` (starts its own event loop)."""
        return asyncio.run(self.arun(prompt, **kwargs))

    async def stream(
        self,
        prompt: str,
        *,
        history: Iterable[Message] = (),
        run_id: str | None = None,
        cancel: CancelToken | None = None,
        stream_text: bool = True,
    ) -> AsyncIterator[TraceEvent | RunResult[OutputT]]:
        """Yield each TraceEvent as it happens (text deltas too), then the RunResult."""
        queue: asyncio.Queue[TraceEvent | None] = asyncio.Queue()
        task = asyncio.ensure_future(self.arun(prompt, history=history, run_id=run_id, cancel=cancel,
                                               on_event=queue.put_nowait, stream_text=stream_text))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
            yield task.result()
        finally:
            if not task.done():
                task.cancel()
