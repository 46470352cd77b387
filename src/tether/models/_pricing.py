"""Prices per million tokens, turning usage into USD. Overridable per agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tether._types import Usage

# (input USD per 1M tokens, output USD per 1M tokens). Public list prices; override for your contract.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "o4-mini": (1.10, 4.40),
    "claude-haiku-4.5": (1.00, 5.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-sonnet-4.5": (3.00, 15.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-opus-4.1": (15.00, 75.00),
    "claude-3-5-haiku": (0.80, 4.00),
}

# Prompt-cache prices as multiples of the input price: (cache read, cache write). Anthropic reads at
# 0.1x and writes (5-minute cache) at 1.25x; OpenAI caches automatically (no write premium) and reads
# at 0.5x (gpt-4o), 0.25x (gpt-4.1, o4-mini) or 0.1x (gpt-5). Longest matching prefix wins.
DEFAULT_CACHE_RATES: dict[str, tuple[float, float]] = {
    "claude-": (0.1, 1.25),
    "gpt-4o": (0.5, 1.0),
    "gpt-4.1": (0.25, 1.0),
    "o4-mini": (0.25, 1.0),
    "gpt-5": (0.1, 1.0),
}


@dataclass(slots=True)
class Pricing:
    """Looks a model up by exact name, then without a provider prefix (`anthropic/x` -> `x`),
    then by the longest known name it starts with (dated snapshots like `gpt-4o-2024-08-06`).
    Unknown models cost 0; `known()` tells whether a price exists."""

    prices: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    cache_rates: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_CACHE_RATES))
    _resolved: dict[str, tuple[float, float] | None] = field(default_factory=dict, init=False, repr=False,
                                                           compare=False)

    def with_prices(self, extra: Mapping[str, tuple[float, float]]) -> Pricing:
        merged = dict(self.prices)
        merged.update(extra)
        return Pricing(merged, dict(self.cache_rates))

    def lookup(self, model: str) -> tuple[float, float] | None:
        if model in self.prices:
            return self.prices[model]
        try:  # the prefix search runs once per model name, not once per call
            return self._resolved[model]
        except KeyError:
            pass
        bare = model.rsplit("/", 1)[-1]
        if bare in self.prices:
            found: tuple[float, float] | None = self.prices[bare]
        else:
            best = max((name for name in self.prices if bare.startswith(name)), key=len, default=None)
            found = self.prices[best] if best else None
        self._resolved[model] = found
        return found

    def known(self, model: str) -> bool:
        return self.lookup(model) is not None

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        price = self.lookup(model)
        if price is None:
            return 0.0
        return (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000

    def cache_rate(self, model: str) -> tuple[float, float]:
        """(read, write) multiples of the input price for cached prompt tokens; (1, 1) if unknown."""
        bare = model.rsplit("/", 1)[-1]
        best = max((name for name in self.cache_rates if bare.startswith(name)), key=len, default=None)
        return self.cache_rates[best] if best else (1.0, 1.0)

    def usage_cost(self, model: str, usage: Usage) -> float:
        """USD for one call's usage; cached input tokens (part of `input_tokens`) at the cache rates."""
        price = self.lookup(model)
        if price is None:
            return 0.0
        read, write = self.cache_rate(model) if usage.cached_input_tokens or usage.cache_write_tokens else (1, 1)
        fresh = max(0, usage.input_tokens - usage.cached_input_tokens - usage.cache_write_tokens)
        inp = fresh + usage.cached_input_tokens * read + usage.cache_write_tokens * write
        return (inp * price[0] + usage.output_tokens * price[1]) / 1_000_000
