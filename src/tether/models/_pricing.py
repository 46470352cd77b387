"""Prices per million tokens, turning usage into USD. Overridable per agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether._errors import InvalidInput
from tether._types import ModelReply, Usage

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
    A model the table lacks has no price: a run with a cost ceiling refuses it at start
    (`require_prices`) unless a price is stated for it, by `with_prices`, by the model itself (a
    `price` attribute: `LocalModel` runs here for (0, 0)), or for every such model by `unpriced`
    (e.g. `Pricing(unpriced=(0.0, 0.0))` to count them as free, knowingly)."""

    prices: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    cache_rates: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_CACHE_RATES))
    unpriced: tuple[float, float] | None = None
    _resolved: dict[str, tuple[float, float] | None] = field(default_factory=dict, init=False, repr=False,
                                                           compare=False)

    def with_prices(self, extra: Mapping[str, tuple[float, float]]) -> Pricing:
        merged = dict(self.prices)
        merged.update(extra)
        return Pricing(merged, dict(self.cache_rates), self.unpriced)

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

    def rates(self, model: str, declared: tuple[float, float] | None = None) -> tuple[float, float] | None:
        """The stated price of `model`: the table's, else the model's own (`declared`), else `unpriced`."""
        found = self.lookup(model)
        if found is None:
            found = declared if declared is not None else self.unpriced
        return found

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

    def usage_cost(self, model: str, usage: Usage, price: tuple[float, float] | None = None) -> float:
        """USD for one call's usage (at `price`, else the table's); cached input tokens (part of
        `input_tokens`) at the cache rates."""
        price = price if price is not None else self.lookup(model)
        if price is None:
            return 0.0
        read, write = self.cache_rate(model) if usage.cached_input_tokens or usage.cache_write_tokens else (1, 1)
        fresh = max(0, usage.input_tokens - usage.cached_input_tokens - usage.cache_write_tokens)
        inp = fresh + usage.cached_input_tokens * read + usage.cache_write_tokens * write
        return (inp * price[0] + usage.output_tokens * price[1]) / 1_000_000


class UnpricedModel(InvalidInput):
    """A cost ceiling over a model whose price tether does not know: the run is refused at start."""


def declared_price(model: Any) -> tuple[float, float] | None:
    """The price a model states for itself (`price`, USD per 1M input and output tokens), or None."""
    price = getattr(model, "price", None)
    return price if isinstance(price, tuple) and len(price) == 2 else None


def model_rates(model: Any, pricing: Pricing) -> tuple[float, float] | None:
    """USD per 1M (input, output) tokens; for a model that tries several (FallbackModel), the
    dearest of each; None when any has no price (its cost cannot be bounded before the call)."""
    inner = getattr(model, "models", None)
    if not inner:
        return pricing.rates(model.name, declared_price(model))
    rates = [model_rates(m, pricing) for m in inner]
    if any(r is None for r in rates):
        return None
    return max(r[0] for r in rates if r), max(r[1] for r in rates if r)


def unpriced_models(model: Any, pricing: Pricing) -> list[str]:
    """The names of the models `model` may call (each of a FallbackModel's) that have no price."""
    inner = getattr(model, "models", None)
    if inner:
        return [name for m in inner for name in unpriced_models(m, pricing)]
    return [] if pricing.rates(model.name, declared_price(model)) is not None else [model.name]


def unpriced_message(name: str, what: str = "max_cost_usd") -> str:
    """One line: which model has no price, and the ways to state one."""
    return (f"{what} cannot bound the model '{name}': tether has no price for it. State its USD per 1M input and "
            f"output tokens: Agent(pricing=Pricing().with_prices({{'{name}': (IN, OUT)}})), or "
            f"TETHER_PRICES='{name}=IN,OUT' for the tether command; Pricing(unpriced=(IN, OUT)) counts every "
            "unpriced model at that price")


def require_prices(model: Any, pricing: Pricing, what: str = "max_cost_usd") -> None:
    """Raise UnpricedModel (one line naming the model) unless every model `model` may call has a price."""
    missing = unpriced_models(model, pricing)
    if missing:
        raise UnpricedModel(unpriced_message(missing[0], what))


def _answered_by(model: Any, reply: ModelReply) -> Any:
    """The model that wrote `reply`: for a FallbackModel, the inner model it names as asked."""
    asked = reply.requested
    for inner in getattr(model, "models", None) or ():
        found = _answered_by(inner, reply)
        if getattr(found, "name", None) == asked:
            return found
    return model


def charge(pricing: Pricing, model: Any, reply: ModelReply) -> float:
    """USD charged for one reply: the highest of its cost at the asked model's stated price, at the
    price of the model the reply names (when the table knows it: a router or alias may answer with a
    dearer model), and the cost the provider reported. A reply naming a model with no price is
    charged at the asked model's price, which the call was admitted at."""
    usage = reply.usage
    cost = usage.cost_usd  # the provider's own figure, when it reports one (0 otherwise)
    if reply.requested:  # a FallbackModel's inner model
        asked, name = _answered_by(model, reply), reply.requested
    else:  # every step: no more calls than the one lookup and the one price
        asked, name = model, model.name
    price = pricing.prices.get(name)  # `lookup`, its frame only for a name not in the table
    if price is None:
        price = pricing.lookup(name)
    if price is None:  # `declared_price(asked)`, inline
        price = getattr(asked, "price", None)
        if not (isinstance(price, tuple) and len(price) == 2):
            price = pricing.unpriced
    if price is not None:
        if usage.cached_input_tokens or usage.cache_write_tokens:
            at = pricing.usage_cost(name, usage, price)
        else:  # `usage_cost` without cached tokens: every input token at the input price
            fresh = usage.input_tokens if usage.input_tokens > 0 else 0
            at = (fresh * price[0] + usage.output_tokens * price[1]) / 1_000_000
        if at > cost:
            cost = at
    named = reply.model
    if named and named != name:
        other = pricing.lookup(named)
        if other is not None and other != price:
            at = pricing.usage_cost(named, usage, other)
            if at > cost:
                cost = at
    return cost
