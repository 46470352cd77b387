"""Run limits, budget accounting and loop detection: the guards checked before every model call."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from tether._errors import InvalidInput
from tether._json import dumps_fn
from tether._types import StopReason, Usage

# The most a model call admitted in this task may use: (input tokens, output tokens, USD), set by `Budget.admit` just before
# the call is sent. A durable step runner checkpoints it first (write-ahead), so a call a crash cuts
# off is still charged when the run is recovered (tether.durable._runner).
ADMITTED: ContextVar[tuple[int, int, float] | None] = ContextVar("tether_admitted", default=None)
# ModelReply.finish_reason of a call sent before a crash whose reply was never recorded: its usage is
# the admitted maximum; the run charges it and admits the call again.
LOST_CALL = "lost_in_crash"


class Clock(Protocol):
    """Seconds from an arbitrary origin; swap it in tests to drive the time budget."""

    def now(self) -> float: ...


class MonotonicClock:
    """The real clock."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


@dataclass(slots=True)
class Limits:
    """Bounds on one run. `None` switches a bound off.

    `max_steps` counts model calls. A slice of the token, time and cost budgets
    (`final_reserve`, a fraction) is kept for the one tool-free call that writes the partial
    answer when a budget is hit. `max_input_tokens` bounds what one model call is sent: it is kept by a
    context builder that counts tokens (`tether.context.Compaction` compacts to fit, or stops the run
    with one clear error); the default `FullHistory` does not count. `max_repeats` identical calls (same tool, same canonical
    arguments) are allowed; the next one is answered with an observation instead of being run,
    and one more after that stops the run with `loop_detected`.
    """

    max_steps: int | None = 20
    max_tokens: int | None = None
    max_seconds: float | None = None
    max_cost_usd: float | None = None
    max_tool_calls: int | None = None
    max_repeats: int | None = 3
    final_answer: bool = True
    final_reserve: float = 0.1
    max_parallel_tools: int = 8
    max_input_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_tokens", "max_seconds", "max_cost_usd", "max_tool_calls", "max_repeats",
                     "max_input_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidInput(f"Limits.{name} must be >= 0 or None, got {value}")
        if not 0 <= self.final_reserve < 1:
            raise InvalidInput(f"Limits.final_reserve must be in [0, 1), got {self.final_reserve}")
        if self.max_parallel_tools < 1:
            raise InvalidInput("Limits.max_parallel_tools must be >= 1")


class Budget:
    """Accounts a run's usage against its Limits; `exceeded()` is O(1)."""

    __slots__ = ("_cost_cap", "_time_cap", "_token_cap", "clock", "limits", "now", "reserved_cost", "reserved_tokens",
                 "started", "steps", "usage")

    def __init__(self, limits: Limits, clock: Clock, usage: Usage | None = None, steps: int = 0) -> None:
        self.limits = limits
        self.clock = clock
        # read several times a step: the real clock without its method frame (the loop reads
        # `now() - started` itself, for the run's seconds without a method frame either)
        self.now = time.monotonic if type(clock) is MonotonicClock else clock.now
        self.started = clock.now() - (usage.seconds if usage else 0.0)
        self.usage = usage or Usage()
        self.steps = steps
        self.reserved_tokens = 0  # carved out for sub-agents now running (see `carve`)
        self.reserved_cost = 0.0
        ADMITTED.set(None)  # this run's calls are admitted by this budget, not a run above it
        keep = 1.0 - limits.final_reserve if limits.final_answer else 1.0
        self._token_cap = None if limits.max_tokens is None else limits.max_tokens * keep
        self._cost_cap = None if limits.max_cost_usd is None else limits.max_cost_usd * keep
        self._time_cap = None if limits.max_seconds is None else limits.max_seconds * keep

    def elapsed(self) -> float:
        return self.now() - self.started

    def remaining_seconds(self) -> float | None:
        """Seconds left before the time budget (reserve excluded); None when unbounded."""
        if self._time_cap is None:
            return None
        return max(0.0, self._time_cap - (self.now() - self.started))

    def final_seconds(self) -> float | None:
        """Seconds the final tool-free call may take: what is left of the whole time budget, and at
        least its reserved slice (so a run overrun by a step still gets its partial answer)."""
        if self.limits.max_seconds is None:
            return None
        total = self.limits.max_seconds
        return max(total - self.elapsed(), total * self.limits.final_reserve)

    def exceeded(self) -> StopReason | None:
        """The budget that forbids another model call, or None."""
        lim, usage = self.limits, self.usage  # checked twice a step: no property or method frames
        if lim.max_steps is not None and self.steps >= lim.max_steps:
            return StopReason.MAX_STEPS
        if self._token_cap is not None and usage.input_tokens + usage.output_tokens + self.reserved_tokens >= self._token_cap:
            return StopReason.TOKEN_BUDGET
        if self._cost_cap is not None and usage.cost_usd + self.reserved_cost >= self._cost_cap:
            return StopReason.COST_BUDGET
        if lim.max_tool_calls is not None and usage.tool_calls >= lim.max_tool_calls:
            return StopReason.TOOL_CALL_BUDGET
        if self._time_cap is not None and self.now() - self.started >= self._time_cap:
            return StopReason.TIME_BUDGET
        return None

    def admit(self, input_tokens: int, rates: tuple[float, float] | None, *, final: bool = False,
              min_output: int = 1) -> tuple[StopReason | None, int | None]:
        """Before a model call of `input_tokens`: (None, the output cap that keeps usage within the
        token and cost ceilings, None if unbounded), or (the budget it would cross, None) when not even
        `min_output` tokens fit. Steps stop short of the reserve; the final call may use it.
        `rates` are USD per 1M (input, output) tokens; without them cost is checked after the call."""
        lim, usage = self.limits, self.usage
        cap: int | None = None
        if lim.max_tokens is not None:
            ceiling = lim.max_tokens if final else self._token_cap
            assert ceiling is not None
            cap = math.floor(ceiling - usage.input_tokens - usage.output_tokens - self.reserved_tokens - input_tokens)
            if cap < min_output:
                return StopReason.TOKEN_BUDGET, None
        if lim.max_cost_usd is not None and rates is not None:
            ceiling = lim.max_cost_usd if final else self._cost_cap
            assert ceiling is not None
            left = (ceiling - usage.cost_usd - self.reserved_cost) * 1_000_000 - input_tokens * rates[0]  # per 1M
            if rates[1] > 0:
                afford = math.floor(left / rates[1] * (1 - 1e-9))  # float rounding never rounds up
                if afford < min_output:
                    return StopReason.COST_BUDGET, None
                cap = afford if cap is None else min(cap, afford)
            elif left < 0:
                return StopReason.COST_BUDGET, None
        out = cap or 0
        ADMITTED.set((input_tokens, out,
                      0.0 if rates is None else (input_tokens * rates[0] + out * rates[1]) / 1_000_000))
        return None, cap

    def carve(self, share: float) -> tuple[int | None, float | None]:
        """Reserve `share` of what is left of the token and cost budgets (the final answer's reserve
        excluded) for a sub-agent: (tokens, USD), None where unbounded. Reserved amounts count as
        spent until `settle`, so siblings carving at once never share the same tokens."""
        tokens = cost = None
        if self._token_cap is not None:
            left = self._token_cap - self.usage.input_tokens - self.usage.output_tokens - self.reserved_tokens
            tokens = max(0, math.floor(left * share))
            self.reserved_tokens += tokens
        if self._cost_cap is not None:
            left_usd = self._cost_cap - self.usage.cost_usd - self.reserved_cost
            cost = max(0.0, left_usd * share)
            self.reserved_cost += cost
        return tokens, cost

    def settle(self, tokens: int | None, cost: float | None, used: Usage) -> None:
        """Release a `carve` and charge what the sub-agent used (within what was carved)."""
        self.reserved_tokens -= tokens or 0
        self.reserved_cost -= cost or 0.0
        self.usage.input_tokens += used.input_tokens
        self.usage.output_tokens += used.output_tokens
        self.usage.cost_usd += used.cost_usd
        self.usage.model_calls += used.model_calls
        self.usage.cached_input_tokens += used.cached_input_tokens
        self.usage.cache_write_tokens += used.cache_write_tokens

    def final_output_tokens(self) -> int | None:
        """An output cap for the final call: what is left of the token budget, at least the reserve
        (and never under 64 tokens, enough for a short partial answer); None when unbounded."""
        if self.limits.max_tokens is None:
            return None
        left = self.limits.max_tokens - self.usage.total_tokens
        reserve = int(self.limits.max_tokens * self.limits.final_reserve)
        return max(64, left, reserve)

    def tool_calls_left(self) -> int | None:
        if self.limits.max_tool_calls is None:
            return None
        return max(0, self.limits.max_tool_calls - self.usage.tool_calls)

    def record_model_call(self, usage: Usage) -> None:
        self.steps += 1
        self.usage.input_tokens += usage.input_tokens
        self.usage.output_tokens += usage.output_tokens
        self.usage.cost_usd += usage.cost_usd
        self.usage.model_calls += 1
        self.usage.cached_input_tokens += usage.cached_input_tokens
        self.usage.cache_write_tokens += usage.cache_write_tokens

    def finish(self) -> Usage:
        self.usage.seconds = self.elapsed()
        return self.usage


_canonical = dumps_fn(sort_keys=True, separators=(",", ":"))  # json.dumps(..., default=str), built once


def canonical_call_key(name: str, arguments: dict[str, Any]) -> str:
    """Same tool + same arguments (key order, whitespace ignored) -> same key."""
    try:
        args = _canonical(arguments)
    except (TypeError, ValueError):
        args = repr(sorted(arguments.items(), key=lambda kv: kv[0]))
    return f"{name}\x00{args}"


class LoopDetector:
    """Counts identical calls. Per call: 'run', 'warn' (observation instead of running) or 'stop'."""

    __slots__ = ("counts", "max_repeats", "warned")

    def __init__(self, max_repeats: int | None, counts: dict[str, int] | None = None,
                 warned: Iterable[str] = ()) -> None:
        self.max_repeats = max_repeats
        self.counts: dict[str, int] = counts if counts is not None else {}  # a RunState's, carried on
        self.warned: set[str] = set(warned)

    def check(self, name: str, arguments: dict[str, Any]) -> str:
        if self.max_repeats is None:
            return "run"
        try:  # canonical_call_key(name, arguments), without its frame for the usual JSON arguments
            key = f"{name}\x00{_canonical(arguments)}"
        except (TypeError, ValueError):
            key = canonical_call_key(name, arguments)
        if key in self.warned:
            return "stop"
        count = self.counts.get(key, 0) + 1
        self.counts[key] = count
        if count > self.max_repeats:
            self.warned.add(key)
            return "warn"
        return "run"

    def observation(self, name: str) -> str:
        return (
            f"NOTICE: you already called {name} with exactly these arguments {self.max_repeats} times; "
            "it was not run again because the result would not change. Use the earlier results, try "
            "different arguments or another tool, or give your final answer. Repeating this exact call "
            "again ends the run."
        )
