"""The critic: claims checked against tool outputs, one revision with reasons, its cost in the run."""

from __future__ import annotations

import asyncio

from tether import Agent, Limits, tool
from tether._critic import Critic, run_with_critic, unsupported_claims
from tether._types import Usage
from tether.models._scripted import ScriptedModel, call


@tool
def lookup(topic: str) -> str:
    """Look a fact up.

    Args:
        topic: the topic
    """
    return "checkout p99 latency: 1465 ms since 10:15:00 after deploy v2.14.0 (INC-4031)"


def test_unsupported_claims_are_whole_tokens() -> None:
    evidence = "checkout p99 latency: 1465 ms since 10:15:00 after deploy v2.14.0 (INC-4031); v2.12 earlier"
    assert unsupported_claims("p99 is 1,465 ms since 10:15, v2.14.0, INC-4031.", evidence) == []
    assert unsupported_claims("p99 is 1,520 ms since 10:51 on v2.15.0 (INC-4032), 12 times more", evidence) == [
        "1,520", "10:51", "v2.15.0", "INC-4032", "12"]


def run(script: list, critic: Critic, **limits) -> tuple:
    model = ScriptedModel(script, usage=Usage(100, 10))
    agent = Agent(model, tools=[lookup], limits=Limits(**limits))
    return asyncio.run(run_with_critic(agent, "How slow is checkout?", critic)), model


def test_a_wrong_number_is_sent_back_once_with_reasons() -> None:
    result, model = run([call("lookup", topic="checkout"), "p99 is 1,520 ms.", "p99 is 1,465 ms."], Critic())
    assert result.completed and result.answer == "p99 is 1,465 ms."
    revise = model.requests[2].messages[-1].content
    assert "'1,520' appears in no tool output" in revise
    assert [e.data["ok"] for e in result.trace if e.kind == "critic"] == [False]
    assert result.usage.model_calls == 3 and result.steps == 3


def test_a_supported_answer_is_not_reviewed_again() -> None:
    result, model = run([call("lookup", topic="checkout"), "p99 is 1,465 ms."], Critic())
    assert result.answer == "p99 is 1,465 ms." and model.calls == 2


def test_reviewer_model_reasons_and_cost_count_in_the_run() -> None:
    reviewer = ScriptedModel(["REVISE: does not say when it started\n- the start time is missing", "OK"],
                             usage=Usage(500, 20))
    result, model = run([call("lookup", topic="checkout"), "p99 is 1,465 ms.", "p99 is 1,465 ms since 10:15."],
                        Critic(reviewer))
    assert result.answer.endswith("since 10:15.")
    sent = model.requests[2].messages[-1].content
    assert "does not say when it started" in sent and "the start time is missing" in sent
    # the reviewer saw a fresh context: the task, the tool output and the answer only
    seen = reviewer.requests[0].messages
    assert len(seen) == 1 and "1465 ms" in seen[0].content and "p99 is 1,465 ms." in seen[0].content
    assert result.usage.input_tokens == 3 * 100 + 500  # only one review: max_revisions=1


def test_the_revision_shares_the_budget() -> None:
    script = [call("lookup", topic="checkout"), "p99 is 1,520 ms.", call("lookup", topic="x"), "p99 is 1,465 ms."]
    result, _ = run(script, Critic(), max_steps=3)
    assert result.steps == 3 and result.stop_reason.value == "max_steps"


def test_citations_required() -> None:
    review = asyncio.run(Critic(require_citations=True).review("q", "It is 1465 ms.", ["1465 ms"]))
    assert not review.ok and review.reasons == ["the answer cites no passage ([1], [2], ...)"]
    assert asyncio.run(Critic(require_citations=True).review("q", "It is 1465 ms [1].", ["[1] 1465 ms"])).ok


def test_the_reviewer_is_priced_with_the_agents_price_table() -> None:
    """Issue 24, item 7: the reviewer's call (100k input tokens on gpt-4o) added tokens but $0."""
    from tether.models._pricing import Pricing

    reviewer = ScriptedModel(["OK"], name="gpt-4o", usage=Usage(100_000, 20))
    model = ScriptedModel([call("lookup", topic="checkout"), "p99 is 1,465 ms."], usage=Usage(100, 10))
    agent = Agent(model, tools=[lookup], pricing=Pricing())
    result = asyncio.run(run_with_critic(agent, "How slow is checkout?", Critic(reviewer)))
    assert result.usage.cost_usd == Pricing().cost("gpt-4o", 100_000, 20) > 0.2


def test_a_reviewer_call_that_would_cross_the_token_limit_is_not_made() -> None:
    reviewer = ScriptedModel(["REVISE: no"], usage=Usage(500, 20))
    result, _ = run([call("lookup", topic="checkout"), "p99 is 1,465 ms."], Critic(reviewer), max_tokens=300)
    assert reviewer.calls == 0
    assert result.usage.total_tokens <= 300
