"""`Agent`: the configuration of a run (model, tools, instructions, limits, policy). No loop logic here."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

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
from tether.tools.base import Tool
from tether.tools.executor import Executor, Policy
from tether.tools.results import DEFAULT_MAX_RESULT_CHARS
from tether.types import Message, RunResult, TraceEvent


@dataclass
class Agent:
    """A model with tools, bounded by limits.

    >>> agent = Agent(model, tools=[calculator], instructions="Be brief.", limits=Limits(max_steps=5))
    >>> result = agent.run("What is 17 * 23?")
    >>> result.stop_reason, result.answer
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

    def __post_init__(self) -> None:
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
    ) -> RunResult:
        """Run to a stop reason. `history` continues a conversation (e.g. `result.messages`)."""
        spec = self._spec(run_id, cancel, on_event, stream_text)
        return await run_loop(spec, self.start_messages(prompt, history))

    def run(self, prompt: str, **kwargs) -> RunResult:
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
    ) -> AsyncIterator[TraceEvent | RunResult]:
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
