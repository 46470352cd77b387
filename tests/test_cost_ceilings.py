"""A cost ceiling needs prices: a model with no price (the run's own, a fallback, a sub-agent's) is
refused before anything is spent, unless a price is stated for it; a reply is charged at the dearest
of the prices it could be billed at (issue: ceilings that survive unknown prices)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion
from hang import HANG

from tether import Agent, Limits, StopReason, tool
from tether._tokens import counter_for, message_tokens, tools_tokens
from tether._types import ModelReply, ModelRequest, Usage
from tether.models import FallbackModel
from tether.models._openai_compat import reply_from_completion
from tether.models._pricing import Pricing, UnpricedModel, charge
from tether.models._scripted import ScriptedModel, call

UNPRICED = "llama-3.1-70b-versatile"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def looping(name: str, reply_as: str | None = None) -> ScriptedModel:
    """A model that asks for a lookup forever, each reply named `reply_as` when given; it counts its
    input as tether does and writes 800 tokens, never more than the request's `max_output_tokens`."""
    count = 0
    counter = counter_for(name)

    def step(request: ModelRequest) -> ModelReply:
        nonlocal count
        count += 1
        used_in = sum(message_tokens(counter, m) for m in request.messages) + 3
        used_in += tools_tokens(counter, list(request.tools))
        out = min(800, request.max_output_tokens or 800)
        return ModelReply("", [call("lookup", key=f"k{count}")], Usage(used_in, out), model=reply_as or "")

    return ScriptedModel(step, name=name)


def test_a_cost_ceiling_over_an_unpriced_model_is_refused_before_any_call() -> None:
    model = looping(UNPRICED)
    with pytest.raises(UnpricedModel) as refused:
        Agent(model, tools=[lookup], limits=Limits(max_steps=16, max_cost_usd=0.001))
    message = str(refused.value)
    assert UNPRICED in message and "with_prices" in message and "TETHER_PRICES" in message
    assert "\n" not in message
    assert model.calls == 0


def test_a_ceiling_set_after_the_agent_was_built_is_refused_when_the_run_starts() -> None:
    model = looping(UNPRICED)
    agent = Agent(model, tools=[lookup], limits=Limits(max_steps=16))
    agent.limits.max_cost_usd = 0.001
    with pytest.raises(UnpricedModel, match=UNPRICED):
        agent.run("go")
    assert model.calls == 0


def test_a_fallback_onto_an_unpriced_model_is_refused_naming_it() -> None:
    model = FallbackModel([looping("gpt-4o"), looping(UNPRICED)])
    with pytest.raises(UnpricedModel, match=f"'{UNPRICED}'"):
        Agent(model, tools=[lookup], limits=Limits(max_cost_usd=0.05))


def test_a_sub_agent_with_an_unpriced_model_is_refused_with_its_parent() -> None:
    child = Agent(looping(UNPRICED), tools=[lookup], name="child")
    with pytest.raises(UnpricedModel, match=UNPRICED):
        Agent(looping("gpt-4o-mini"), tools=[child.as_tool("helper")], limits=Limits(max_cost_usd=0.05))


def test_a_stated_price_lets_the_ceiling_bound_the_model() -> None:
    stated = Pricing().with_prices({UNPRICED: (0.59, 0.79)})
    result = Agent(looping(UNPRICED), tools=[lookup], pricing=stated,
                   limits=Limits(max_steps=16, max_cost_usd=0.001, max_repeats=None)).run("go")
    assert result.stop_reason is StopReason.COST_BUDGET
    assert 0 < result.usage.cost_usd <= 0.001


def test_opting_in_to_one_price_for_every_unpriced_model() -> None:
    free = Pricing(unpriced=(0.0, 0.0))
    result = Agent(looping(UNPRICED), tools=[lookup], pricing=free,
                   limits=Limits(max_steps=3, max_cost_usd=0.001, max_repeats=None)).run("go")
    assert result.stop_reason is StopReason.MAX_STEPS and result.usage.cost_usd == 0


def test_a_model_that_states_its_own_price_needs_no_table_entry() -> None:
    model = looping("local:my-gguf")
    model.price = (0.0, 0.0)  # type: ignore[attr-defined]  # as LocalModel does
    result = Agent(model, tools=[lookup], limits=Limits(max_steps=2, max_cost_usd=0.01)).run("go")
    assert result.stop_reason is StopReason.MAX_STEPS


def test_a_reply_naming_a_dearer_model_is_charged_at_its_price_and_raises_the_admitted_rates() -> None:
    # asked for gpt-4o-mini ($0.15/$0.60), answered as gpt-4o ($2.50/$10): charged at gpt-4o's price
    model = looping("gpt-4o-mini", reply_as="gpt-4o-2024-08-06")
    result = Agent(model, tools=[lookup], limits=Limits(max_steps=40, max_cost_usd=0.01, max_repeats=None)).run("go")
    first = next(e for e in result.trace if e.kind == "model_call")
    at_gpt_4o = (first.data["input_tokens"] * 2.50 + first.data["output_tokens"] * 10.0) / 1_000_000
    assert first.data["cost_usd"] == pytest.approx(at_gpt_4o)
    assert result.stop_reason is StopReason.COST_BUDGET
    assert result.usage.cost_usd <= 0.01  # later calls were admitted at the dearer rates


def test_a_reply_naming_an_unpriced_model_is_charged_at_the_asked_price() -> None:
    reply = ModelReply("", usage=Usage(1_000, 1_000), model="some-router/unknown-7b")
    assert charge(Pricing(), looping("gpt-4o"), reply) == pytest.approx((1_000 * 2.5 + 1_000 * 10) / 1e6)


def test_a_fallback_reply_is_charged_at_the_inner_model_that_answered() -> None:
    cheap, dear = looping("gpt-4o-mini"), looping("claude-opus-4.1")
    model = FallbackModel([cheap, dear])
    reply = ModelReply("", usage=Usage(1_000_000, 0), model="gpt-4o-mini-2024-07-18", requested="gpt-4o-mini")
    assert charge(Pricing(), model, reply) == pytest.approx(0.15)


def test_a_provider_reported_cost_above_the_table_is_charged() -> None:
    body = chat_completion("ok")
    body["usage"]["cost"] = 0.5  # OpenRouter's bill, in USD
    from openai.types.chat import ChatCompletion

    reply = reply_from_completion(ChatCompletion.model_validate(body), "gpt-4o-mini")
    assert reply.usage.cost_usd == 0.5
    assert charge(Pricing(), looping("gpt-4o-mini"), reply) == 0.5


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=HANG)


def test_the_cli_refuses_max_cost_over_an_unpriced_model_as_a_usage_error(tmp_path: Path) -> None:
    env: dict[str, Any] = {k: v for k, v in os.environ.items()
                           if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_", "ANTHROPIC_"))}
    with FakeOpenAIServer([chat_completion("hello")]) as server:
        env.update(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=server.base_url)
        proc = _cli(["-p", "hi", "--tools", "none", "--model", UNPRICED, "--max-cost", "0.001"], env, tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and UNPRICED in proc.stderr and "TETHER_PRICES" in proc.stderr
        assert server.requests == []
        env["TETHER_PRICES"] = f"{UNPRICED}=0.59,0.79"
        stated = _cli(["-p", "hi", "--tools", "none", "--model", UNPRICED, "--max-cost", "0.001"], env, tmp_path)
    assert stated.returncode == 0, stated.stderr
    assert stated.stdout == "hello\n"


def test_a_service_task_asking_for_a_cost_ceiling_over_an_unpriced_model_is_refused() -> None:
    from tether.server._registry import Registry, RegistryError

    registry = Registry({"helper": lambda user: Agent(looping(UNPRICED), tools=[lookup])})
    assert registry.build("helper", "alice", {"max_steps": 3}).limits.max_steps == 3
    with pytest.raises(RegistryError, match=UNPRICED):
        registry.build("helper", "alice", {"max_cost_usd": 0.01})


def test_a_critic_with_an_unpriced_reviewer_under_a_cost_ceiling_is_refused_before_the_run() -> None:
    import asyncio

    from tether import Critic, run_with_critic

    worker = ScriptedModel(["the answer is 4"], name="gpt-4o-mini")
    reviewer = ScriptedModel(["OK"], name=UNPRICED)
    agent = Agent(worker, limits=Limits(max_cost_usd=0.01))
    with pytest.raises(UnpricedModel, match=UNPRICED):
        asyncio.run(run_with_critic(agent, "2+2?", Critic(model=reviewer)))
    assert worker.calls == 0 and reviewer.calls == 0
