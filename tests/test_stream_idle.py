"""The idle timeout: a model server that sends bytes but never a complete reply or stream event is
stopped within `idle_timeout`, while a slow but real stream (complete events, each within it) is not.
Real HTTP on 127.0.0.1 (tests/trickle_server.py) through the real SDKs. The outer `asyncio.timeout`s
only catch hangs; the deadlines are far beyond the idle timeouts, so only the idle timeout can end
these calls early."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fake_openai_server import chat_completion, completion_chunks
from hang import HANG
from trickle_server import Trickler

from tether import Agent, Limits, StopReason
from tether._errors import InvalidInput
from tether._types import Message, ModelReply, ModelRequest, TextDelta
from tether.models._base import ModelError
from tether.models._openai_compat import OpenAICompatModel

ASK = ModelRequest([Message.user("hi")])


def openai_model(server: Trickler, **kwargs: Any) -> OpenAICompatModel:
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("deadline", 30.0)
    return OpenAICompatModel("m", base_url=server.base_url, api_key="k", timeout=30, **kwargs)


async def drain(model: Any, request: ModelRequest = ASK) -> tuple[str, ModelReply | None]:
    text, final = "", None
    async for item in model.stream(request):
        if isinstance(item, TextDelta):
            text += item.text
        else:
            final = item
    return text, final


def sse(events: list[dict[str, Any]]) -> list[bytes]:
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]


@pytest.mark.parametrize("call", ["complete", "stream"])
async def test_a_trickle_of_bytes_stops_within_the_idle_timeout(call: str) -> None:
    with Trickler(every=0.1) as slow:  # a space every 0.1 s: a per-read timeout never fires
        model = openai_model(slow, idle_timeout=1.0)
        async with asyncio.timeout(HANG):
            with pytest.raises(ModelError) as err:
                await (model.complete(ASK) if call == "complete" else drain(model))
    what = "no complete reply" if call == "complete" else "no stream event"
    assert f"stalled: {what} within the 1s idle timeout" in str(err.value)
    assert err.value.retryable and "\n" not in str(err.value)
    assert slow.connections == 1


async def test_one_event_trickled_byte_by_byte_is_a_stall() -> None:
    # A complete, valid chunk, but one byte every 0.05 s: it would take ~10 s to finish the event.
    frame = sse(completion_chunks(chat_completion("hello there")))[1]
    with Trickler(every=0.05, pieces=[bytes([b]) for b in frame], content_type="text/event-stream") as slow:
        model = openai_model(slow, idle_timeout=1.0)
        async with asyncio.timeout(HANG):
            with pytest.raises(ModelError, match="stalled: no stream event within the 1s idle timeout"):
                await drain(model)


async def test_a_slow_but_real_stream_is_not_stopped() -> None:
    # 16 complete events 0.2 s apart: the stream takes longer than the idle timeout, each gap far less.
    chunks = completion_chunks(chat_completion("one two three four five six seven eight nine ten"), pieces=12)
    with Trickler(every=0.2, pieces=sse(chunks), content_type="text/event-stream") as slow:
        model = openai_model(slow, idle_timeout=2.0)
        async with asyncio.timeout(HANG):
            text, final = await drain(model)
    assert len(chunks) >= 14
    assert text == "one two three four five six seven eight nine ten"
    assert final is not None and final.text == text


async def test_a_stall_is_retried_like_a_timeout() -> None:
    with Trickler(every=0.1) as slow:
        model = openai_model(slow, idle_timeout=0.5, max_retries=1, backoff_base=0.01, backoff_max=0.01)
        async with asyncio.timeout(HANG):
            with pytest.raises(ModelError, match=r"stalled: no complete reply .* \(gave up after 2 attempts\)"):
                await model.complete(ASK)
    assert slow.connections == 2


async def test_retried_stalls_end_at_the_whole_call_deadline() -> None:
    with Trickler(every=0.1) as slow:
        model = openai_model(slow, idle_timeout=0.5, max_retries=1000, backoff_base=0.01, backoff_max=0.01,
                             deadline=3.0)
        async with asyncio.timeout(HANG):
            with pytest.raises(ModelError, match=r"within the 3s deadline .*last error: stalled: no complete reply"):
                await model.complete(ASK)
    assert 2 <= slow.connections < 1000


async def test_anthropic_stops_a_trickle_within_the_idle_timeout() -> None:
    pytest.importorskip("anthropic", reason="the anthropic extra is not installed")
    from tether.models._anthropic import AnthropicModel

    with Trickler(every=0.1) as slow:
        model = AnthropicModel("claude-fake", api_key="k", base_url=slow.root_url, timeout=30, deadline=30,
                               idle_timeout=1.0, max_retries=0)
        async with asyncio.timeout(HANG):
            with pytest.raises(ModelError, match="stalled: no complete reply within the 1s idle timeout"):
                await model.complete(ASK)
            with pytest.raises(ModelError, match="stalled: no stream event within the 1s idle timeout"):
                await drain(model)


@pytest.mark.parametrize("stream_text", [False, True], ids=["complete", "stream"])
async def test_the_runs_own_time_limit_stops_a_model_with_no_idle_timeout_or_deadline(stream_text: bool) -> None:
    with Trickler(every=0.1) as slow:
        model = openai_model(slow, idle_timeout=None, deadline=None)
        agent = Agent(model=model, tools=[], limits=Limits(max_seconds=1.0))
        async with asyncio.timeout(HANG):
            result = await agent.arun("hi", stream_text=stream_text)
    assert result.stop_reason is StopReason.TIME_BUDGET


@pytest.mark.parametrize("idle", [0, -1.0])
def test_idle_timeout_must_be_positive(idle: float) -> None:
    with pytest.raises(InvalidInput, match="idle_timeout must be > 0"):
        OpenAICompatModel("m", base_url="http://127.0.0.1:9/v1", api_key="k", idle_timeout=idle)
