"""The steps of a run, as typed nodes: what `agent.iter()` yields, each before it runs.

A run goes Start -> (Admit -> CallModel -> PlanCalls -> Execute -> Observe)* -> StopRun -> End; any
step may go to StopRun instead (a guard, a failure, a cancellation). The nodes are views for the caller
to read; changing them does not steer the run (the guards decide every transition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic

from typing_extensions import TypeVar

from tether._types import ModelReply, ModelRequest, RunResult, StopReason, ToolCall, ToolResult

OutputT = TypeVar("OutputT", default=str)


@dataclass(slots=True)
class Start:
    """The run begins: its policy state is loaded, decided approvals run, the input filter screens the prompt."""


@dataclass(slots=True)
class Admit:
    """The guards before a model call (cancellation, every budget), then the request is built and sized
    against the token and cost ceilings."""


@dataclass(slots=True)
class CallModel:
    """The admitted request, about to be sent (its output capped to what the ceilings leave)."""

    request: ModelRequest
    counted: int = 0  # its input tokens as tether counted them (0 without a token or cost ceiling)


@dataclass(slots=True)
class PlanCalls:
    """The model's reply: its tool calls are planned (or the answer is checked and the run completes)."""

    reply: ModelReply


@dataclass(slots=True)
class Execute:
    """The turn's tool calls, about to go through the policy and the executor (concurrently)."""

    calls: list[ToolCall]


@dataclass(slots=True)
class Observe:
    """The turn's results (None: a call that did not run), about to be written to the transcript in
    call order; `stop` is the reason a per-call guard stopped the run, if one did."""

    calls: list[ToolCall]
    results: list[ToolResult | None]
    stop: StopReason | None = None


@dataclass(slots=True)
class StopRun:
    """The run stops for `reason`: open calls are answered, the final answer is written (a budget or
    loop stop), filtered, and the state saved."""

    reason: StopReason
    error: str | None = None


@dataclass(slots=True)
class End(Generic[OutputT]):
    """The run has ended: `result` is what `agent.run()` returns."""

    result: RunResult[OutputT]


Step = Start | Admit | CallModel | PlanCalls | Execute | Observe | StopRun | End[Any]
