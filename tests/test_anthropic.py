"""AnthropicModel: message mapping as pure functions, then the real SDK against a fake /v1/messages."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer, Reply

from tether._types import Message, ModelReply, ModelRequest, TextDelta, ToolCall, ToolSpec
from tether.models._anthropic import AnthropicModel, to_anthropic_messages, to_anthropic_tools
from tether.models._base import Model, ModelError

pytest.importorskip("anthropic", reason="the anthropic extra is not installed")

ADD = ToolSpec("add", "Add two numbers.", {"type": "object", "properties": {"a": {"type": "number"}}})


# ----- pure mapping --------------------------------------------------------------------------------


def test_system_messages_go_to_system_joined() -> None:
    system, messages = to_anthropic_messages(
        [Message.system("rule one"), Message.user("hi"), Message.system("rule two")]
    )
    assert system == "rule one\n\nrule two"
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_tool_calls_and_results_map_to_blocks() -> None:
    history = [
        Message.user("add twice"),
        Message.assistant("On it.", [ToolCall("t1", "add", {"a": 1}), ToolCall("t2", "add", {"a": 2})]),
        Message("tool", "1", tool_call_id="t1", name="add"),
        Message("tool", "2", tool_call_id="t2", name="add"),
        Message.user("and explain"),
        Message.assistant("", [ToolCall("t3", "add", {}, parse_error="not JSON", raw_arguments="{x")]),
        Message("tool", "", tool_call_id="t3"),
    ]
    system, messages = to_anthropic_messages(history)
    assert system == ""
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "add twice"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}},
                {"type": "tool_use", "id": "t2", "name": "add", "input": {"a": 2}},
            ],
        },
        {  # consecutive results share one user message, results before the text that follows
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "1"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "2"},
                {"type": "text", "text": "and explain"},
            ],
        },
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "add", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3"}]},
    ]


def test_tool_results_stay_ahead_of_text_when_text_came_first() -> None:
    _, messages = to_anthropic_messages(
        [
            Message.assistant("", [ToolCall("t1", "add", {})]),
            Message.user("note"),
            Message("tool", "r", tool_call_id="t1"),
        ]
    )
    assert [b["type"] for b in messages[1]["content"]] == ["tool_result", "text"]


def test_empty_messages_are_dropped_and_neighbours_merged() -> None:
    _, messages = to_anthropic_messages(
        [
            Message.user("a"),
            Message.assistant(""),
            Message.user("b"),
            Message.user(" \n"),
            Message.assistant("  "),
            Message.assistant("c"),
        ]
    )
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
    ]


def test_tools_use_input_schema() -> None:
    assert to_anthropic_tools([ADD]) == [
        {"name": "add", "description": ADD.description, "input_schema": ADD.parameters}
    ]


def test_bad_messages_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="tool message without tool_call_id"):
        to_anthropic_messages([Message("tool", "x")])
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        AnthropicModel("claude", api_key="k", max_tokens=0)


def test_missing_sdk_gives_a_one_line_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_anthropic(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "anthropic":
            raise ImportError("No module named 'anthropic'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_anthropic)
    with pytest.raises(ImportError, match=r"pip install 'tether\[anthropic\]'"):
        AnthropicModel("claude-haiku-4-5", api_key="k")


# ----- real HTTP -----------------------------------------------------------------------------------


def message_body(
    content: list[dict[str, Any]], stop_reason: str = "end_turn", **usage: int
) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake-1",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 12} | usage,
    }


def anthropic_error(status: int, kind: str, message: str) -> Reply:
    return Reply.json({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def stream_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events Anthropic sends for `body`, text and tool JSON split into pieces."""
    start = body | {
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": body["usage"]["input_tokens"], "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for i, block in enumerate(body["content"]):
        if block["type"] == "text":
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            text = block["text"]
            for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                delta = {"type": "text_delta", "text": piece}
                events.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
                )
        else:
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            events.append(
                ("content_block_start", {"type": "content_block_start", "index": i, "content_block": head})
            )
            raw = block.get("raw") or json.dumps(block["input"])
            for piece in (raw[:5], raw[5:]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
                )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(("ping", {"type": "ping"}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": body["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        yield s


def make_model(server: FakeOpenAIServer, **kwargs: Any) -> AnthropicModel:
    kwargs.setdefault("backoff_base", 0.001)
    return AnthropicModel("claude-fake", api_key="sk-ant-test", base_url=server.root_url, **kwargs)


REQUEST = ModelRequest(
    [Message.system("be brief"), Message.user("add 1")], tools=[ADD], temperature=0.0, stop=["END"]
)
TOOL_REPLY = message_body(
    [
        {"type": "text", "text": "Adding now."},
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
    ],
    stop_reason="tool_use",
)


async def test_complete_over_http(server: FakeOpenAIServer) -> None:
    server.push(Reply.json(TOOL_REPLY))
    model = make_model(server, max_tokens=321)
    assert isinstance(model, Model)
    reply = await model.complete(REQUEST)
    assert reply == ModelReply(
        text="Adding now.",
        tool_calls=[ToolCall("toolu_1", "add", {"a": 1})],
        usage=reply.usage,
        model="claude-fake-1",
        finish_reason="tool_use",
    )
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (30, 12)
    seen = server.requests[0]
    assert seen.path == "/v1/messages"
    # the key travels as x-api-key or (newer SDKs) a bearer token
    assert "sk-ant-test" in seen.headers.get("x-api-key", "") + seen.headers.get("authorization", "")
    assert seen.body["system"] == [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    assert seen.body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert seen.body["max_tokens"] == 321
    assert seen.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "add 1"}]}]
    assert seen.body["tools"][0]["input_schema"] == ADD.parameters
    assert seen.body["temperature"] == 0.0 and seen.body["stop_sequences"] == ["END"]


async def test_cached_prompt_tokens_count_as_input(server: FakeOpenAIServer) -> None:
    server.push(
        Reply.json(
            message_body(
                [{"type": "text", "text": "hi"}], cache_read_input_tokens=100, cache_creation_input_tokens=5
            )
        )
    )
    reply = await make_model(server).complete(REQUEST)
    assert reply.usage.input_tokens == 135
    assert (reply.usage.cached_input_tokens, reply.usage.cache_write_tokens) == (100, 5)


async def test_overloaded_is_retried_then_succeeds(server: FakeOpenAIServer) -> None:
    server.push(anthropic_error(529, "overloaded_error", "Overloaded"), Reply.json(TOOL_REPLY))
    assert (await make_model(server).complete(REQUEST)).text == "Adding now."
    assert len(server.requests) == 2


async def test_bad_request_fails_at_once_with_provider_message(server: FakeOpenAIServer) -> None:
    server.responder = lambda _req: anthropic_error(
        400, "invalid_request_error", "messages: roles must alternate"
    )
    with pytest.raises(ModelError, match="HTTP 400: messages: roles must alternate"):
        await make_model(server).complete(REQUEST)
    assert len(server.requests) == 1


async def test_persistent_rate_limit_gives_up(server: FakeOpenAIServer) -> None:
    server.responder = lambda _req: anthropic_error(429, "rate_limit_error", "too many")
    with pytest.raises(ModelError, match=r"HTTP 429: too many \(gave up after 3 attempts\)"):
        await make_model(server, max_retries=2).complete(REQUEST)
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    "body",
    [
        TOOL_REPLY,
        message_body([{"type": "text", "text": "Just some text, streamed."}]),
        message_body(
            [{"type": "tool_use", "id": "toolu_9", "name": "add", "input": {}, "raw": '{"a": [1, 2'}],
            stop_reason="tool_use",
        ),
    ],
    ids=["text-and-tool", "text", "malformed-json"],
)
async def test_stream_over_http(server: FakeOpenAIServer, body: dict[str, Any]) -> None:
    server.push(Reply.sse(stream_events(body), done_marker=False))
    deltas: list[str] = []
    final: list[ModelReply] = []
    async for item in make_model(server).stream(REQUEST):
        if isinstance(item, TextDelta):
            deltas.append(item.text)
        else:
            final.append(item)
    assert len(final) == 1
    reply = final[0]
    expected_text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
    assert reply.text == "".join(deltas) == expected_text
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (30, 12)
    assert reply.finish_reason == body["stop_reason"]
    assert server.requests[0].body["stream"] is True
    tool_blocks = [b for b in body["content"] if b["type"] == "tool_use"]
    assert [c.id for c in reply.tool_calls] == [b["id"] for b in tool_blocks]
    for call, block in zip(reply.tool_calls, tool_blocks, strict=True):
        if "raw" in block:
            assert call.parse_error and "not valid JSON" in call.parse_error
            assert call.raw_arguments == block["raw"]
        else:
            assert call.arguments == block["input"] and call.parse_error is None


# ----- tool choice, keys, total deadline -----------------------------------------------------------


@pytest.mark.parametrize(("choice", "sent"), [
    (None, None),
    ("auto", {"type": "auto"}),
    ("none", {"type": "none"}),
    ("required", {"type": "any"}),
    ("add", {"type": "tool", "name": "add"}),
])
async def test_tool_choice_reaches_the_server(server: FakeOpenAIServer, choice: str | None, sent: object) -> None:
    server.push(Reply.json(TOOL_REPLY), Reply.sse(stream_events(TOOL_REPLY), done_marker=False))
    model = make_model(server)
    request = ModelRequest(REQUEST.messages, tools=[ADD], tool_choice=choice)
    await model.complete(request)
    async for _ in model.stream(request):
        pass
    for seen in server.requests:
        assert seen.body.get("tool_choice") == sent
        assert seen.body["tools"][0]["name"] == "add"


async def test_the_environment_key_goes_only_to_its_own_url(server: FakeOpenAIServer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env-secret")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    server.push(Reply.json(TOOL_REPLY), Reply.json(TOOL_REPLY))
    await AnthropicModel("claude-fake", base_url=server.root_url, backoff_base=0.001).complete(REQUEST)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.root_url)
    await AnthropicModel("claude-fake", backoff_base=0.001).complete(REQUEST)
    other, own = (json.dumps(r.headers) for r in server.requests)
    assert "sk-ant-env-secret" not in other  # a base URL it was not configured for
    assert "sk-ant-env-secret" in own


def test_no_key_for_anthropic_itself_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ValueError, match=r"no API key for api\.anthropic\.com: set ANTHROPIC_API_KEY"):
        AnthropicModel("claude")


@pytest.mark.parametrize("silent", [False, True], ids=["trickling", "silent"])
async def test_a_call_that_never_finishes_ends_at_its_deadline(silent: bool) -> None:
    from trickle_server import Trickler

    with Trickler(every=0.2, silent=silent) as slow:
        model = AnthropicModel("claude-fake", api_key="k", base_url=slow.root_url, deadline=1.0, timeout=30)
        with pytest.raises(ModelError, match="no complete reply within the 1s deadline"):
            await model.complete(REQUEST)
        with pytest.raises(ModelError, match="no complete reply within the 1s deadline"):
            async for _ in model.stream(REQUEST):
                pass
