"""Budgets are ceilings: a model call that could cross the token or cost limit is never sent, and the
partial answer written at a budget stop fits what is left (issue 24, item 1)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import Agent, Limits, StopReason, tool
from tether._tokens import counter_for, message_tokens, tools_tokens
from tether._types import ModelReply, ModelRequest, Usage
from tether.models._pricing import Pricing
from tether.models._scripted import call

BUDGET_STOPS = {StopReason.TOKEN_BUDGET, StopReason.COST_BUDGET, StopReason.MAX_STEPS}


class HonestModel:
    """A provider that counts input as OpenAI's tokenizer does and never writes more than the request's
    `max_output_tokens`; each step it wants a random number of output tokens and fetches a random size."""

    def __init__(self, seed: int, name: str = "gpt-4o-mini") -> None:
        self.name = name
        self.rng = random.Random(seed)
        self.counter = counter_for(name)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        used_in = sum(message_tokens(self.counter, m) for m in request.messages) + 3
        used_in += tools_tokens(self.counter, list(request.tools))
        want = self.rng.randint(20, 3_000)
        out = want if request.max_output_tokens is None else min(want, request.max_output_tokens)
        if request.tool_choice == "none" or not request.tools:
            return ModelReply("partial: " + "w " * min(out, 50), [], Usage(used_in, out))
        return ModelReply("", [call("fetch", size=self.rng.randint(1, 4_000), tag=len(self.requests))],
                          Usage(used_in, out))

    async def stream(self, request: ModelRequest):  # pragma: no cover - not streamed here
        yield await self.complete(request)


@tool
def fetch(size: int, tag: int = 0) -> str:
    """Return `size` words of text."""
    return "lorem ipsum " * (size // 2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), max_tokens=st.integers(300, 30_000),
       max_cost=st.floats(0.0005, 0.05), price_in=st.floats(0.05, 20.0), price_out=st.floats(0.1, 60.0),
       reserve=st.sampled_from([0.0, 0.05, 0.1, 0.3]), use_tokens=st.booleans(), use_cost=st.booleans())
def test_reported_usage_never_exceeds_a_limit(seed, max_tokens, max_cost, price_in, price_out, reserve,
                                              use_tokens, use_cost) -> None:
    limits = Limits(max_steps=30, max_tokens=max_tokens if use_tokens else None,
                    max_cost_usd=max_cost if use_cost else None, final_reserve=reserve, max_repeats=None)
    pricing = Pricing().with_prices({"gpt-4o-mini": (price_in, price_out)})
    model = HonestModel(seed)
    result = Agent(model, tools=[fetch], limits=limits, pricing=pricing, max_result_chars=200_000).run("Collect it all.")
    if use_tokens:
        assert result.usage.total_tokens <= max_tokens, (result.usage, result.trace[-3:])
    if use_cost:
        assert result.usage.cost_usd <= max_cost * (1 + 1e-9), result.usage
    assert result.stop_reason in BUDGET_STOPS | {StopReason.COMPLETED}, (result.stop_reason, result.error)
    if result.stop_reason in BUDGET_STOPS:
        assert result.answer  # always a partial answer, from the model or from the findings


def test_the_issue_figures_a_20k_token_limit_is_a_ceiling() -> None:
    """The issue's run: big tool outputs under max_tokens=20_000 used 27,648 tokens; the partial-answer
    call re-sent 6,181 tokens against a 2,000-token reserve."""
    model = HonestModel(7)
    model.rng = random.Random(7)
    result = Agent(model, tools=[fetch], limits=Limits(max_steps=None, max_tokens=20_000, max_repeats=None),
                   max_result_chars=200_000).run("Collect it all.")
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert result.usage.total_tokens <= 20_000
    final = model.requests[-1]
    assert final.max_output_tokens is not None and final.max_output_tokens >= 1
    assert result.answer


def test_a_call_that_would_cross_the_limit_is_not_sent() -> None:
    """With a 1,000-token limit and a 5,000-token prompt, no step is sent; the one call made is the
    final one, sent the task cut to fit; and with a 30-token limit not even that."""
    model = HonestModel(1)
    big = "word " * 5_000
    result = Agent(model, tools=[fetch], limits=Limits(max_tokens=1_000)).run(big)
    assert len(model.requests) == 1 and not model.requests[0].tools
    assert "[...cut here]" in model.requests[0].messages[-1].content
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert 0 < result.usage.total_tokens <= 1_000
    model = HonestModel(1)
    result = Agent(model, tools=[fetch], limits=Limits(max_tokens=30)).run(big)
    assert model.requests == []
    assert result.usage.total_tokens == 0
    assert "limit" in result.answer


def test_the_final_call_is_condensed_to_fit_its_reserve() -> None:
    """A transcript larger than what is left: the final call gets the task and the findings, cut, and
    fits; the whole transcript is not re-sent."""
    model = HonestModel(3)
    result = Agent(model, tools=[fetch], limits=Limits(max_steps=None, max_tokens=9_000, final_reserve=0.2,
                                                       max_repeats=None),
                   max_result_chars=200_000).run("Collect it all.")
    assert result.usage.total_tokens <= 9_000
    final = model.requests[-1]
    if not final.tools:  # condensed: one system-free user message with the findings
        assert "What the run found so far" in final.messages[-1].content
    assert result.answer


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), max_tokens=st.integers(2_000, 30_000))
def test_compaction_summaries_are_admitted_too(seed, max_tokens) -> None:
    """The context builder's own model calls (compaction summaries, asked for up to 800 output tokens)
    go through the same ceiling: one that would cross it is not sent and the summary falls back to
    what the run did (before: it was sent and the run went over)."""
    from tether.context import Compaction

    model = HonestModel(seed)
    result = Agent(model, tools=[fetch], limits=Limits(max_steps=30, max_tokens=max_tokens, max_repeats=None),
                   context=Compaction(window=6_000, keep_turns=1), max_result_chars=20_000).run("Collect it all.")
    assert result.usage.total_tokens <= max_tokens, result.usage
