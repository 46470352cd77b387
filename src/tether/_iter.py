"""`agent.iter()`: a run stepped by its caller, one typed node (tether._steps) at a time.

The nodes come from the same `LoopRun.next` that `run_loop` drives, so a stepped run takes exactly
the branches, emits exactly the events and ends with exactly the result of `agent.arun()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Generic, cast

from typing_extensions import TypeVar

from tether._errors import InvalidInput
from tether._loop import LoopRun
from tether._steps import End, Start, Step, StopRun
from tether._types import RunResult, StopReason, Usage
from tether.events import Notice

OutputT = TypeVar("OutputT", default=str)

LEFT = "the caller left agent.iter() before the run ended"


class AgentRun(Generic[OutputT]):
    """One run, stepped: each node is yielded before its step runs, the last is `End(result)`.

    >>> async with agent.iter("What is 17 * 23?") as run:
    ...     async for node in run:
    ...         print(type(node).__name__)
    >>> run.result.answer

    Leaving the `async with` block before the End stops the run as cancelled: its open calls are
    answered, its jobs stopped and its state saved, as for a run cancelled by a CancelToken.
    """

    __slots__ = ("_loop", "_make", "_node", "_yielded")

    def __init__(self, make: Callable[[], LoopRun]) -> None:
        self._make = make
        self._loop: LoopRun | None = None
        self._node: Step | None = None  # the node to run next (the last one yielded)
        self._yielded = False

    async def __aenter__(self) -> AgentRun[OutputT]:
        if self._loop is not None:
            raise InvalidInput("an agent.iter() run is entered once; call agent.iter() again for another run")
        self._loop = self._make()
        self._node = Start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        loop, node = self._loop, self._node
        if loop is None or node is None or type(node) is End:
            return
        if type(node) is not StopRun:  # left mid-run: stopped as a cancelled run is, every open call answered
            loop.emit(Notice(notice={"cancelled": LEFT}))
            node = StopRun(StopReason.CANCELLED, LEFT)
        self._node = await loop.stop(node)

    def __aiter__(self) -> AgentRun[OutputT]:
        return self

    async def __anext__(self) -> Step:
        return await self.next()

    async def next(self) -> Step:
        """Run the step of the node last yielded and return the next node (the first call returns Start,
        which has not run yet). StopAsyncIteration once End was returned."""
        loop, node = self._loop, self._node
        if loop is None or node is None:
            raise InvalidInput("step an agent.iter() run inside `async with agent.iter(...) as run:`")
        if not self._yielded:
            self._yielded = True
            return node
        if type(node) is End:
            raise StopAsyncIteration
        loop.deadline.task = asyncio.current_task()  # the time budget interrupts whichever task steps the run
        self._node = node = await loop.next(node)
        return node

    @property
    def node(self) -> Step | None:
        """The node whose step runs next (End once the run has ended); None before `async with`."""
        return self._node

    @property
    def result(self) -> RunResult[OutputT] | None:
        """The run's result once it has ended (the same RunResult `agent.arun()` returns), else None."""
        node = self._node
        return cast(RunResult[OutputT], node.result) if isinstance(node, End) else None

    @property
    def usage(self) -> Usage | None:
        """What the run has used so far (tokens, cost, model and tool calls), read live from its budget."""
        return None if self._loop is None else self._loop.budget.usage
