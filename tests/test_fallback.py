"""FallbackModel over real HTTP: two fake servers (OpenAI-compatible and Anthropic), the real SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer, Reply, chat_completion, tool_call
from pydantic import BaseModel

from tether import Agent, StopReason, tool
from tether._output import FINAL_TOOL
from tether._types import Message, ModelReply, ModelRequest, TextDelta
from tether.models._base import ModelError
from tether.models._fallback import FallbackModel, is_context_length_error, should_fall_back
from tether.models._openai_compat import OpenAICompatModel
from tether.models._scripted import ScriptedModel, call

pytest.importorskip("anthropic", reason="the anthropic extra is not installed")

from tether.models._anthropic import AnthropicModel

PRIMARY, SECONDARY = "gpt-4o-mini", "claude-haiku-4-5"  # both in the default price table


@tool
def lookup(city: str) -> str:
    """Look a city's population up."""
    return f"{city}: 2,100,000 people"


def anthropic_text(text: str, input_tokens: int = 40, output_tokens: int = 8) -> Reply:
    return Reply.json({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": SECONDARY,
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    })


@pytest.fixture
def servers() -> Iterator[tuple[FakeOpenAIServer, FakeOpenAIServer]]:
    with FakeOpenAIServer() as first, FakeOpenAIServer() as second:
        yield first, second


def fallback(servers: tuple[FakeOpenAIServer, FakeOpenAIServer], **primary: Any) -> FallbackModel:
    first, second = servers
    primary.setdefault("max_retries", 1)
    one = OpenAICompatModel(PRIMARY, base_url=first.base_url, api_key="sk-test", backoff_base=0.001, **primary)
    two = AnthropicModel(SECONDARY, api_key="sk-ant-test", base_url=second.root_url, backoff_base=0.001)
    return FallbackModel([one, two])


def test_primary_500s_after_its_retries_and_the_secondary_answers(servers) -> None:
    first, second = servers
    first.push(Reply.error(500, "boom"), Reply.error(503, "still down"))
    second.push(anthropic_text("Paris"))
    result = Agent(fallback(servers)).run("Capital of France?")
    assert result.completed and result.answer == "Paris"
    assert len(first.requests) == 2  # the primary's own retry came first
    assert second.requests[0].path == "/v1/messages"
    [event] = [e for e in result.trace if e.kind == "model_call"]
    assert event.data["model"] == SECONDARY  # the trace says who answered


def test_primary_times_out_and_the_secondary_answers(servers) -> None:
    first, second = servers
    first.push(Reply(body=chat_completion("too late"), delay=3))
    second.push(anthropic_text("Paris"))
    result = Agent(fallback(servers, timeout=0.3, max_retries=0)).run("Capital of France?")
    assert result.completed and result.answer == "Paris"
    assert len(first.requests) == 1 and len(second.requests) == 1


def test_429_with_a_long_retry_after_falls_back_at_once(servers) -> None:
    first, second = servers
    first.push(Reply.error(429, "slow down", headers={"retry-after": "3600"}))
    second.push(anthropic_text("Paris"))
    result = Agent(fallback(servers, max_retries=3)).run("Capital of France?")
    assert result.completed and len(first.requests) == 1  # no waiting an hour, no pointless retries


def test_context_length_error_falls_back(servers) -> None:
    first, second = servers
    first.push(Reply.error(400, "This model's maximum context length is 128000 tokens."))
    second.push(anthropic_text("Paris"))
    assert Agent(fallback(servers)).run("Capital of France?").completed


@pytest.mark.parametrize(("status", "message"), [(400, "Invalid value for 'messages'"), (401, "bad key"),
                                                 (403, "forbidden"), (422, "unprocessable")])
def test_a_request_another_model_would_also_refuse_does_not_fall_back(servers, status: int, message: str) -> None:
    first, second = servers
    first.push(Reply.error(status, message))
    result = Agent(fallback(servers)).run("Capital of France?")
    assert result.stop_reason is StopReason.ERROR
    assert f"HTTP {status}: {message}" in (result.error or "")
    assert len(first.requests) == 1 and second.requests == []


def test_usage_and_cost_are_per_model_across_steps(servers) -> None:
    first, second = servers
    first.push(chat_completion(None, [tool_call("lookup", {"city": "Paris"})], prompt_tokens=100,
                               completion_tokens=10, model=PRIMARY),
               Reply.error(500, "boom"), Reply.error(500, "boom"))
    second.push(anthropic_text("2.1 million", input_tokens=200, output_tokens=20))
    result = Agent(fallback(servers), tools=[lookup]).run("How many live in Paris?")
    assert result.completed and result.answer == "2.1 million"
    by_model = result.usage_by_model
    assert set(by_model) == {PRIMARY, SECONDARY}
    assert (by_model[PRIMARY].input_tokens, by_model[PRIMARY].model_calls) == (100, 1)
    assert (by_model[SECONDARY].input_tokens, by_model[SECONDARY].model_calls) == (200, 1)
    assert by_model[PRIMARY].cost_usd == pytest.approx((100 * 0.15 + 10 * 0.60) / 1e6)  # gpt-4o-mini prices
    assert by_model[SECONDARY].cost_usd == pytest.approx((200 * 1.00 + 20 * 5.00) / 1e6)  # haiku prices
    assert result.usage.cost_usd == pytest.approx(by_model[PRIMARY].cost_usd + by_model[SECONDARY].cost_usd)
    # the secondary saw the whole conversation, tool result included
    sent = second.requests[0].body["messages"]
    assert sent[-1]["content"][0]["type"] == "tool_result" and "2,100,000" in sent[-1]["content"][0]["content"]


def test_every_model_failing_is_one_error_naming_each(servers) -> None:
    first, second = servers
    first.push(Reply.error(500, "primary down"), Reply.error(500, "primary down"))
    second.push(*[Reply.json({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                             status=529)] * 4)
    result = Agent(fallback(servers)).run("Capital of France?")
    assert result.stop_reason is StopReason.ERROR
    assert "every model failed" in (result.error or "")
    assert "primary down" in (result.error or "") and "Overloaded" in (result.error or "")


async def test_streaming_falls_back_before_any_text(servers) -> None:
    first, second = servers
    first.push(Reply.error(502, "bad gateway"), Reply.error(502, "bad gateway"))
    second.push(anthropic_text("Paris"))  # a JSON body: the SDK's stream parser is not involved
    model = fallback(servers)
    model.models[1] = _CompleteOnly(model.models[1])
    items = [item async for item in model.stream(ModelRequest([Message.user("Capital?")]))]
    assert isinstance(items[0], TextDelta) and items[0].text == "Paris"
    assert isinstance(items[-1], ModelReply) and items[-1].model == SECONDARY


class _CompleteOnly:
    """Streams by completing (keeps this test about falling back, not about SSE parsing)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.native_output = True

    async def complete(self, request: ModelRequest) -> ModelReply:
        return await self.inner.complete(request)

    async def stream(self, request: ModelRequest):
        reply = await self.inner.complete(request)
        yield TextDelta(reply.text)
        yield reply


def test_structured_output_goes_to_each_model_in_its_own_form(servers) -> None:
    class City(BaseModel):
        name: str

    first, _ = servers
    first.push(Reply.error(500, "x"), Reply.error(500, "x"))
    scripted = ScriptedModel([call(FINAL_TOOL, name="Paris")])  # no native support: the final tool
    one = OpenAICompatModel(PRIMARY, base_url=first.base_url, api_key="k", backoff_base=0.001, max_retries=1)
    result = Agent(FallbackModel([one, scripted]), output_type=City).run("Capital?")
    assert result.completed and result.output == City(name="Paris")
    assert "response_format" in first.requests[0].body
    assert scripted.requests[0].tools[-1].name == FINAL_TOOL and scripted.requests[0].output_schema is None


def test_the_rule() -> None:
    assert should_fall_back(ModelError("x: HTTP 500", retryable=True))
    assert not should_fall_back(ModelError("x: HTTP 400: bad", retryable=False))
    assert should_fall_back(ModelError("x: HTTP 400: prompt is too long: 210000 tokens > 200000 maximum",
                                       retryable=False))
    assert should_fall_back(TimeoutError())
    assert not should_fall_back(ValueError("a bug"))
    assert is_context_length_error("Requested tokens (5000) exceed context window of 4096")
    assert is_context_length_error("the request exceeds the available context size")
    assert not is_context_length_error("Invalid API key")
    with pytest.raises(ValueError):
        FallbackModel([])


# --- issue 24, item 2: a hung primary falls back; a down primary is skipped by a circuit breaker


def test_a_hung_primary_falls_back_when_its_deadline_passes() -> None:
    """The primary never answers (each reply delayed past the model's deadline): the secondary gets
    the request and the run completes (before: the deadline error was not retryable, the run ended in
    `error` and the secondary saw nothing)."""
    with FakeOpenAIServer([], responder=lambda r: Reply(body=chat_completion("late"), delay=5.0)) as hung:
        primary = OpenAICompatModel(PRIMARY, base_url=hung.base_url, api_key="k", max_retries=0, deadline=0.5)
        secondary = ScriptedModel(["from the secondary"], name=SECONDARY)
        result = Agent(FallbackModel([primary, secondary])).run("hi")
    assert result.stop_reason is StopReason.COMPLETED, result.error
    assert result.answer == "from the secondary"
    assert len(hung.requests) == 1 and secondary.calls == 1


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_down_primary_is_skipped_after_repeated_failures_and_retried_after_the_cooldown() -> None:
    clock = _Clock()
    with FakeOpenAIServer([], responder=lambda r: Reply.error(503, "down")) as down:
        primary = OpenAICompatModel(PRIMARY, base_url=down.base_url, api_key="k", max_retries=1, backoff_base=0.0)
        secondary = ScriptedModel(lambda req: "ok", name=SECONDARY)
        model = FallbackModel([primary, secondary], breaker_failures=2, breaker_cooldown=30, clock=clock)
        agent = Agent(model)
        for _ in range(5):
            assert agent.run("hi").answer == "ok"
        assert len(down.requests) == 4  # 2 steps x 2 attempts, then skipped (not 5 x 2)
        clock.t = 31  # cool-down over: tried once more, fails, skipped again
        for _ in range(3):
            assert agent.run("hi").answer == "ok"
        assert len(down.requests) == 6
    assert secondary.calls == 8


def test_a_context_length_error_does_not_open_the_breaker() -> None:
    with FakeOpenAIServer([], responder=lambda r: Reply.error(400, "maximum context length exceeded")) as small:
        primary = OpenAICompatModel(PRIMARY, base_url=small.base_url, api_key="k", max_retries=0)
        model = FallbackModel([primary, ScriptedModel(lambda req: "ok", name=SECONDARY)], breaker_failures=1)
        agent = Agent(model)
        for _ in range(3):
            agent.run("hi")
    assert len(small.requests) == 3  # asked every time: its prompt limit says nothing of its health
