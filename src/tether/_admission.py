"""Admission: before a model call is sent, size it and cap its output so that it cannot cross the
run's token or cost ceiling. A budget is a ceiling checked before the money is spent, not a total
checked after.

The request's input is counted with the model's own tokenizer where tether has it (tiktoken ranks
for OpenAI models), else with the calibrated estimate times `ESTIMATE_MARGIN`; every reply's reported
input count then corrects the run's factor upward if the count was low. The output is bounded by
`max_output_tokens`, which the provider enforces. So the ceiling holds exactly for a provider that
counts as tether does and honours `max_output_tokens`, and within the estimate's error otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tether._limits import Budget
from tether._tokens import MessageSizes, TiktokenCounter, counter_for, tools_tokens
from tether._types import Message, StopReason, ToolSpec, Usage
from tether.models._base import Model
from tether.models._pricing import Pricing, model_rates

ESTIMATE_MARGIN = 1.25  # the calibrated estimate's error on prose, logs, JSON and code stays well under this
REPLY_PRIMING = 3  # tokens a provider adds to prime the reply
MIN_STEP_OUTPUT = 64  # a step that could not write even a short tool call is not sent


class Admission:
    """Sizes the requests of one run and admits them against its Budget."""

    __slots__ = ("_sizes", "_tools", "_tools_tokens", "counter", "factor", "rates")

    def __init__(self, model: Model, pricing: Pricing) -> None:
        self.counter = counter_for(model.name)
        self.factor = 1.0 if isinstance(self.counter, TiktokenCounter) else ESTIMATE_MARGIN
        self.rates = model_rates(model, pricing)
        self._sizes = MessageSizes(self.counter)
        self._tools: Sequence[ToolSpec] | None = None
        self._tools_tokens = 0

    def count(self, messages: list[Message], tools: Sequence[ToolSpec]) -> int:
        """The request's input tokens as counted (before the run's factor)."""
        n = self._sizes.exact(messages)  # the transcript itself (FullHistory): each message counted once per run
        if tools is not self._tools:
            self._tools, self._tools_tokens = tools, tools_tokens(self.counter, list(tools))
        return n + self._tools_tokens + REPLY_PRIMING

    def admit(self, budget: Budget, counted: int, *, final: bool = False) -> tuple[StopReason | None, int | None]:
        """(the budget this call would cross, None) or (None, the output cap that keeps it within
        every ceiling; None when nothing bounds it). The final call may use the reserve."""
        return budget.admit(math.ceil(counted * self.factor), self.rates, final=final,
                            min_output=1 if final else MIN_STEP_OUTPUT)

    def observe(self, counted: int, usage: Usage) -> None:
        """A reply's reported usage, once charged: an input count that was low raises the run's factor;
        a charge above the admitted rates (a dearer model named in the reply, a provider's bill)
        raises the rates the next calls are admitted at."""
        reported = usage.input_tokens
        if counted > 0 and reported > counted * self.factor:
            self.factor = reported / counted
        if self.rates is not None and usage.cost_usd > 0:
            at_rates = (usage.input_tokens * self.rates[0] + usage.output_tokens * self.rates[1]) / 1_000_000
            if usage.cost_usd > at_rates > 0:
                scale = usage.cost_usd / at_rates
                self.rates = (self.rates[0] * scale, self.rates[1] * scale)
