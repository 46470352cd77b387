"""`FallbackModel`: try models in order, moving on only when another model could succeed.

    model = FallbackModel([OpenAICompatModel("gpt-4o-mini"), AnthropicModel("claude-haiku-4-5")])

Each model keeps its own retry policy (models/_retry.py); the next one is tried only when that
policy has given up on a failure of a retryable kind (5xx, 429 and its Retry-After, timeouts,
connection errors), or on a context-length error (another model may have a longer context). A
request a different model would also refuse (a bad request, auth) fails at once: falling back would
only hide the bug and spend money. Each reply names the model that answered (`ModelReply.model`),
so the run's trace records it per step, `RunResult.usage_by_model` splits usage by it, and the loop
prices each step at the price of the inner model asked (or of the one the reply names, if dearer).
Under a cost ceiling every inner model needs a price (`tether.models._pricing.require_prices`): calls
are admitted at the dearest of them, since any may answer.

A circuit breaker keeps a down model from costing its retries on every step: after
`breaker_failures` failures in a row it is skipped for `breaker_cooldown` seconds, then tried once
again (one success closes it). It is the process's knowledge of a provider's health, shared by the
runs that use this FallbackModel, like a connection pool. When every model is skipped, all are tried.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence

from tether._errors import InvalidInput
from tether._output import request_for
from tether._types import ModelReply, ModelRequest, TextDelta
from tether.models._base import Model, ModelError

log = logging.getLogger("tether.models._fallback")

_CONTEXT_LENGTH = re.compile(
    r"context[_ ]length|maximum context|context window|context size|prompt is too long|too many tokens"
    r"|exceeds? the (?:model's )?(?:maximum|available) (?:context|tokens)",
    re.IGNORECASE,
)


def is_context_length_error(message: str) -> bool:
    """Whether a provider's error says the prompt does not fit the model's context."""
    return _CONTEXT_LENGTH.search(message) is not None


def should_fall_back(exc: BaseException) -> bool:
    """The default rule: a ModelError the retry layer gave up on, or a context-length error."""
    if isinstance(exc, ModelError):
        return exc.retryable is True or is_context_length_error(str(exc))
    return isinstance(exc, TimeoutError)


class FallbackModel:
    """A `Model` that asks `models[0]`, then the next on a failure `fall_back_on` accepts.

    When every model fails, one `ModelError` lists each model's reason. Structured output is
    passed to each model in the form it takes (native or a final-result tool).
    """

    native_output = True  # each inner model gets the request in the form it takes (request_for)

    def __init__(
        self, models: Sequence[Model], *, fall_back_on: Callable[[BaseException], bool] = should_fall_back,
        breaker_failures: int = 3, breaker_cooldown: float = 60.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.models = list(models)
        if not self.models:
            raise InvalidInput("FallbackModel needs at least one model")
        if breaker_failures < 1 or breaker_cooldown < 0:
            raise InvalidInput("breaker_failures must be >= 1 and breaker_cooldown >= 0")
        self.fall_back_on = fall_back_on
        self.name = "fallback:" + ",".join(m.name for m in self.models)
        self.breaker_failures = breaker_failures
        self.breaker_cooldown = breaker_cooldown
        self._clock = clock
        self._failures = [0] * len(self.models)  # failures in a row, per model
        self._open_until = [0.0] * len(self.models)  # skipped until this clock reading

    async def aclose(self) -> None:
        """Close each model's clients for this event loop (see `OpenAICompatModel.aclose`)."""
        for model in self.models:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

    def _order(self) -> list[int]:
        """The models to try: those whose breaker is closed (or whose cool-down is over), in order;
        every model when all are open."""
        now = self._clock()
        ready = [i for i in range(len(self.models)) if self._open_until[i] <= now]
        return ready or list(range(len(self.models)))

    def _succeeded(self, i: int) -> None:
        self._failures[i] = 0
        self._open_until[i] = 0.0

    def _failed(self, i: int) -> None:
        self._failures[i] += 1
        if self._failures[i] >= self.breaker_failures:
            self._open_until[i] = self._clock() + self.breaker_cooldown
            log.warning("model %s failed %d times in a row: skipped for %g s", self.models[i].name,
                        self._failures[i], self.breaker_cooldown)

    def __repr__(self) -> str:
        return f"FallbackModel({self.models!r})"

    async def complete(self, request: ModelRequest) -> ModelReply:
        reasons: list[str] = []
        for i in self._order():
            model = self.models[i]
            try:
                reply = await model.complete(request_for(model, request))
            except Exception as exc:
                self._give_up_unless(exc, i, reasons)
                continue
            self._succeeded(i)
            reply.model = reply.model or model.name
            reply.requested = model.name
            return reply
        raise self._all_failed(reasons)

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        """Stream from the first model that works; once text was yielded there is no falling back
        (the caller has shown it), so a later break raises."""
        reasons: list[str] = []
        for i in self._order():
            model = self.models[i]
            emitted = False
            try:
                async for item in model.stream(request_for(model, request)):
                    if isinstance(item, ModelReply):
                        item.model = item.model or model.name
                        item.requested = model.name
                    else:
                        emitted = True
                    yield item
                self._succeeded(i)
                return
            except Exception as exc:
                if emitted:
                    raise
                self._give_up_unless(exc, i, reasons)
        raise self._all_failed(reasons)

    def _give_up_unless(self, exc: Exception, i: int, reasons: list[str]) -> None:
        """Re-raise `exc` unless the rule allows the next model; else note why this one failed."""
        if not self.fall_back_on(exc):
            raise exc
        model = self.models[i]
        if not is_context_length_error(str(exc)):  # a longer prompt than it takes is not ill health
            self._failed(i)
        reasons.append(f"{model.name}: {exc}")
        log.warning("model %s failed, falling back: %s", model.name, exc)

    def _all_failed(self, reasons: list[str]) -> ModelError:
        return ModelError(f"every model failed: {' | '.join(reasons)}", retryable=True)
