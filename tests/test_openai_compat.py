"""OpenAICompatModel against a real HTTP server on 127.0.0.1, through the real openai SDK."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import openai
import pytest
from fake_openai_server import FakeOpenAIServer, Reply, chat_completion, completion_chunks, tool_call

from tether._types import Message, ModelReply, ModelRequest, TextDelta, ToolCall, ToolSpec
from tether.models._base import Model, ModelError
from tether.models._openai_compat import (
    NO_KEY,
    OPENAI_BASE_URL,
    OPENROUTER_BASE_URL,
    OpenAICompatModel,
    parse_arguments,
    resolve_endpoint,
    to_openai_message,
)

ADD = ToolSpec(
    "add",
    "Add two numbers.",
    {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
)
ASK = ModelRequest([Message.system("be brief"), Message.user("what is 2+3?")], tools=[ADD])


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as s:
        yield s


def make_model(server: FakeOpenAIServer, **kwargs: object) -> OpenAICompatModel:
    kwargs.setdefault("backoff_base", 0.001)
    kwargs.setdefault("backoff_max", 0.01)
    return OpenAICompatModel("fake-model", base_url=server.base_url, api_key="sk-test", **kwargs)  # type: ignore[arg-type]


class SleepRecorder:
    """Stands in for asyncio.sleep so tests see the delays without waiting them out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


async def collect(model: OpenAICompatModel, request: ModelRequest) -> tuple[list[str], ModelReply]:
    deltas: list[str] = []
    final: list[ModelReply] = []
    async for item in model.stream(request):
        if isinstance(item, TextDelta):
            assert not final, "no delta may follow the final reply"
            deltas.append(item.text)
        else:
            final.append(item)
    assert len(final) == 1, "stream must end with exactly one ModelReply"
    return deltas, final[0]


# ----- replies -------------------------------------------------------------------------------------


async def test_plain_text_reply_with_usage(server: FakeOpenAIServer) -> None:
    server.push(chat_completion("5", prompt_tokens=21, completion_tokens=3, model="served-model-v2"))
    model = make_model(server)
    assert isinstance(model, Model)
    reply = await model.complete(ASK)
    assert reply.text == "5"
    assert reply.tool_calls == []
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (21, 3)
    assert reply.finish_reason == "stop"
    assert reply.model == "served-model-v2"
    assert server.requests[0].path == "/v1/chat/completions"
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_tool_call_with_id_and_arguments(server: FakeOpenAIServer) -> None:
    server.push(chat_completion(None, [tool_call("add", {"a": 2, "b": 3}, id="call_abc")]))
    reply = await make_model(server).complete(ASK)
    assert reply.text == ""
    assert reply.tool_calls == [ToolCall("call_abc", "add", {"a": 2, "b": 3})]
    assert reply.finish_reason == "tool_calls"


async def test_several_tool_calls_in_one_reply(server: FakeOpenAIServer) -> None:
    calls = [
        tool_call("add", {"a": 1, "b": 2}, id="c1"),
        tool_call("add", {"a": 3, "b": 4}, id="c2"),
        tool_call("lookup", {"q": "ünïcode"}, id="c3"),
    ]
    server.push(chat_completion("Working on it.", calls))
    reply = await make_model(server).complete(ASK)
    assert reply.text == "Working on it."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("c1", "add", {"a": 1, "b": 2}),
        ("c2", "add", {"a": 3, "b": 4}),
        ("c3", "lookup", {"q": "ünïcode"}),
    ]


async def test_missing_and_repeated_ids_get_unique_generated_ids(server: FakeOpenAIServer) -> None:
    server.push(
        chat_completion(
            None,
            [tool_call("add", {}, id=None), tool_call("add", {}, id="same"), tool_call("add", {}, id="same")],
        )
    )
    reply = await make_model(server).complete(ASK)
    ids = [c.id for c in reply.tool_calls]
    assert ids[1] == "same"
    assert ids[0].startswith("call_") and ids[2].startswith("call_")
    assert len(set(ids)) == 3


@pytest.mark.parametrize(
    ("raw", "expected_error"),
    [
        ('{"a": 1,', "not valid JSON"),
        ("[1, 2]", "got an array"),
        ('"just text"', "got a string"),
        ("42", "got a number"),
        ("null", "got null"),
    ],
)
async def test_malformed_arguments_become_parse_error_not_exception(
    server: FakeOpenAIServer, raw: str, expected_error: str
) -> None:
    server.push(
        chat_completion(None, [tool_call("add", raw, id="bad"), tool_call("add", {"a": 1}, id="good")])
    )
    reply = await make_model(server).complete(ASK)
    bad, good = reply.tool_calls
    assert bad.id == "bad" and bad.name == "add"
    assert bad.arguments == {}
    assert bad.raw_arguments == raw
    assert bad.parse_error is not None and expected_error in bad.parse_error
    assert "JSON object" in bad.parse_error  # tells the model what to send instead
    assert good.parse_error is None and good.arguments == {"a": 1}


def test_parse_arguments_edge_cases() -> None:
    assert parse_arguments("") == ({}, None)  # no-argument tools often send ""
    assert parse_arguments("  ") == ({}, None)
    assert parse_arguments(None) == ({}, None)
    assert parse_arguments({"a": 1}) == ({"a": 1}, None)  # servers that send an object
    assert parse_arguments('{"a": {"b": [1]}}') == ({"a": {"b": [1]}}, None)


async def test_200_without_choices_is_a_model_error(server: FakeOpenAIServer) -> None:
    server.push(Reply.json({"error": {"message": "upstream provider went away", "code": 502}}))
    with pytest.raises(ModelError, match="upstream provider went away"):
        await make_model(server).complete(ASK)


# ----- retries -------------------------------------------------------------------------------------


async def test_500_then_success_is_retried(server: FakeOpenAIServer) -> None:
    server.push(Reply.error(500, "transient"), chat_completion("ok"))
    reply = await make_model(server).complete(ASK)
    assert reply.text == "ok"
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


async def test_429_then_success_honours_retry_after(server: FakeOpenAIServer) -> None:
    server.push(Reply.error(429, "slow down", headers={"retry-after": "0.25"}), chat_completion("ok"))
    model = make_model(server)
    model._sleep = sleeps = SleepRecorder()
    reply = await model.complete(ASK)
    assert reply.text == "ok"
    assert len(server.requests) == 2
    assert sleeps.delays == [0.25]


async def test_backoff_grows_exponentially_with_jitter(server: FakeOpenAIServer) -> None:
    server.push(*[Reply.error(503, "busy")] * 4, chat_completion("ok"))
    model = make_model(server, max_retries=4, backoff_base=1.0, backoff_max=5.0)
    model._sleep = sleeps = SleepRecorder()
    assert (await model.complete(ASK)).text == "ok"
    caps = [1.0, 2.0, 4.0, 5.0]
    assert len(sleeps.delays) == 4
    for delay, cap in zip(sleeps.delays, caps, strict=True):
        assert cap / 2 <= delay <= cap


async def test_persistent_500_gives_up_with_model_error(server: FakeOpenAIServer) -> None:
    server.responder = lambda _req: Reply.error(500, "the GPU caught fire")
    model = make_model(server, max_retries=2)
    with pytest.raises(ModelError) as info:
        await model.complete(ASK)
    message = str(info.value)
    assert len(server.requests) == 3  # first attempt + 2 retries
    assert "HTTP 500" in message and "the GPU caught fire" in message
    assert "gave up after 3 attempts" in message
    assert "\n" not in message
    assert isinstance(info.value.__cause__, openai.InternalServerError)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_fail_immediately(server: FakeOpenAIServer, status: int) -> None:
    server.responder = lambda _req: Reply.error(status, "you did it wrong")
    with pytest.raises(ModelError, match=f"HTTP {status}: you did it wrong"):
        await make_model(server).complete(ASK)
    assert len(server.requests) == 1


async def test_retry_after_beyond_limit_gives_up_at_once(server: FakeOpenAIServer) -> None:
    server.responder = lambda _req: Reply.error(429, "quota", headers={"retry-after": "3600"})
    with pytest.raises(ModelError, match="retry after 3600s"):
        await make_model(server).complete(ASK)
    assert len(server.requests) == 1


async def test_dropped_connection_is_retried(server: FakeOpenAIServer) -> None:
    server.push(Reply(drop=True), chat_completion("ok"))
    assert (await make_model(server).complete(ASK)).text == "ok"
    assert len(server.requests) == 2


async def test_timeout_is_retried_then_gives_up(server: FakeOpenAIServer) -> None:
    server.responder = lambda _req: Reply(body=chat_completion("late"), delay=0.5)
    model = make_model(server, timeout=0.1, max_retries=1)
    with pytest.raises(ModelError, match=r"timed out after 0\.1s \(gave up after 2 attempts\)"):
        await model.complete(ASK)
    assert len(server.requests) == 2


async def test_connection_refused_is_a_model_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAICompatModel("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_base=0.001)
    with pytest.raises(ModelError, match="connection error"):
        await model.complete(ASK)


async def test_given_client_has_its_own_retries_switched_off(server: FakeOpenAIServer) -> None:
    server.responder = lambda _req: Reply.error(500, "down")
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=5)
    model = OpenAICompatModel("m", client=client, max_retries=1, backoff_base=0.001)
    with pytest.raises(ModelError):
        await model.complete(ASK)
    assert len(server.requests) == 2  # ours only, not 2 x 6


# ----- streaming -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        chat_completion("The answer is five, since two plus three is five."),
        chat_completion(
            None, [tool_call("add", {"a": 2, "b": 3}, id="c1"), tool_call("add", {"a": 10, "b": -1}, id="c2")]
        ),
        chat_completion("Let me add.", [tool_call("add", {"a": 2, "b": 3}, id="c1")]),
        chat_completion(None, [tool_call("add", '{"a": 2,', id="c1")]),
    ],
    ids=["text", "tool-calls", "text-and-tool-call", "malformed-args"],
)
async def test_stream_gives_the_same_reply_as_complete(server: FakeOpenAIServer, body: dict) -> None:
    server.push(body, body)
    model = make_model(server)
    whole = await model.complete(ASK)
    deltas, streamed = await collect(model, ASK)
    assert streamed == whole
    assert "".join(deltas) == whole.text
    if whole.text:
        assert len(deltas) > 1  # really streamed, not one lump
    assert server.requests[1].body["stream"] is True
    assert server.requests[1].body["stream_options"] == {"include_usage": True}
    assert streamed.usage.input_tokens == 11


async def test_stream_without_usage_option(server: FakeOpenAIServer) -> None:
    server.push(chat_completion("hi there"))
    _, reply = await collect(make_model(server, stream_usage=False), ASK)
    assert "stream_options" not in server.requests[0].body
    assert reply.text == "hi there"
    assert reply.usage.input_tokens == 0  # the server sent none


async def test_stream_chunks_without_index_start_a_call_on_each_new_id(server: FakeOpenAIServer) -> None:
    chunks = completion_chunks(
        chat_completion(None, [tool_call("add", {"a": 1}, id="x"), tool_call("add", {"b": 2}, id="y")])
    )
    for chunk in chunks:
        for choice in chunk["choices"]:
            for tc in choice["delta"].get("tool_calls", []):
                del tc["index"]
    server.push(Reply.sse(chunks))
    _, reply = await collect(make_model(server), ASK)
    assert [(c.id, c.arguments) for c in reply.tool_calls] == [("x", {"a": 1}), ("y", {"b": 2})]


async def test_stream_retries_a_failure_before_the_first_delta(server: FakeOpenAIServer) -> None:
    server.push(Reply.error(502, "bad gateway"), chat_completion("fine"))
    deltas, reply = await collect(make_model(server), ASK)
    assert reply.text == "fine" and "".join(deltas) == "fine"
    assert len(server.requests) == 2


async def test_stream_broken_after_text_raises_model_error(server: FakeOpenAIServer) -> None:
    chunks = completion_chunks(chat_completion("partial answer that never ends"))[:3]
    server.push(Reply.sse([*chunks, {"error": {"message": "overloaded mid-stream"}}], done_marker=False))
    model = make_model(server)
    seen: list[str] = []
    with pytest.raises(ModelError, match=r"overloaded mid-stream.*stream broke after text was sent"):
        async for item in model.stream(ASK):
            assert isinstance(item, TextDelta)
            seen.append(item.text)
    assert seen  # the text before the break was delivered
    assert len(server.requests) == 1


async def test_stream_persistent_failure_gives_up(server: FakeOpenAIServer) -> None:
    server.responder = lambda _req: Reply.error(503, "still down")
    with pytest.raises(ModelError, match=r"HTTP 503: still down \(gave up after 2 attempts\)"):
        await collect(make_model(server, max_retries=1), ASK)
    assert len(server.requests) == 2


# ----- what goes over the wire ---------------------------------------------------------------------


async def test_request_body_has_the_right_messages_and_tools(server: FakeOpenAIServer) -> None:
    server.push(chat_completion("done"))
    history = [
        Message.system("sys"),
        Message.user("add 2 and 3, then 4 and 5"),
        Message.assistant(
            "", [ToolCall("c1", "add", {"a": 2, "b": 3}), ToolCall("c2", "add", {"a": 4, "b": 5})]
        ),
        Message("tool", "5", tool_call_id="c1", name="add"),
        Message("tool", "9", tool_call_id="c2", name="add"),
        Message.assistant(
            "Now a bad call.", [ToolCall("c3", "add", {}, parse_error="not JSON", raw_arguments="{oops")]
        ),
        Message("tool", "error: not JSON", tool_call_id="c3", name="add"),
    ]
    request = ModelRequest(history, tools=[ADD], max_output_tokens=100, temperature=0.0, stop=["END"])
    model = make_model(server, extra_body={"top_k": 5})
    await model.complete(request)
    body = server.requests[0].body
    assert body["model"] == "fake-model"
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "add 2 and 3, then 4 and 5"},
        {
            "role": "assistant",
            "content": "",  # never null: llama.cpp's server answers 500 to null
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "9"},
        {
            "role": "assistant",
            "content": "Now a bad call.",
            "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "error: not JSON"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": ADD.description, "parameters": ADD.parameters},
        }
    ]
    assert body["max_tokens"] == 100
    assert body["temperature"] == 0.0
    assert body["stop"] == ["END"]
    assert body["top_k"] == 5
    assert "stream" not in body


async def test_no_tools_key_when_there_are_no_tools(server: FakeOpenAIServer) -> None:
    server.push(chat_completion("hi"))
    await make_model(server, temperature=0.3).complete(ModelRequest([Message.user("hi")]))
    body = server.requests[0].body
    assert "tools" not in body
    assert body["temperature"] == 0.3  # the model's default when the request sets none
    assert "max_tokens" not in body and "max_completion_tokens" not in body


def test_api_openai_com_gets_max_completion_tokens() -> None:
    model = OpenAICompatModel("gpt-4o-mini", api_key="k", env={})
    params = model._params(ModelRequest([Message.user("x")], max_output_tokens=7))
    assert params["max_completion_tokens"] == 7 and "max_tokens" not in params


def test_bad_messages_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="tool message without tool_call_id"):
        to_openai_message(Message("tool", "x"))
    with pytest.raises(ValueError, match="unknown message role 'robot'"):
        to_openai_message(Message("robot", "x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model name is required"):
        OpenAICompatModel("", base_url="http://127.0.0.1:1/v1")


def test_sync_callers_can_reuse_the_model_across_event_loops(server: FakeOpenAIServer) -> None:
    # Agent.run() runs each run in a fresh event loop; pooled connections must not leak across.
    server.responder = lambda _req: chat_completion("again")
    model = make_model(server)
    for _ in range(3):
        assert asyncio.run(model.complete(ASK)).text == "again"
    assert len(server.requests) == 3


# ----- where base URL and key come from ------------------------------------------------------------


def test_env_precedence() -> None:
    both = {
        "OPENAI_BASE_URL": "http://openai-like/v1",
        "OPENAI_API_KEY": "sk-openai",
        "OPENROUTER_BASE_URL": "http://router/v1",
        "OPENROUTER_API_KEY": "sk-or",
    }
    assert resolve_endpoint(env=both) == resolve_endpoint(env=both | {"OPENROUTER_API_KEY": "other"})
    assert resolve_endpoint(env=both).base_url == "http://openai-like/v1"
    assert resolve_endpoint(env=both).api_key == "sk-openai"
    # OpenRouter settings are used only when no OPENAI_* is set
    router = {"OPENROUTER_API_KEY": "sk-or"}
    assert resolve_endpoint(env=router) == resolve_endpoint(
        env=router | {"OPENROUTER_BASE_URL": OPENROUTER_BASE_URL}
    )
    assert (resolve_endpoint(env=router).base_url, resolve_endpoint(env=router).api_key) == (
        OPENROUTER_BASE_URL,
        "sk-or",
    )
    assert resolve_endpoint(env={"OPENAI_API_KEY": "sk"} | router).base_url == OPENAI_BASE_URL
    # arguments beat the environment, field by field; an env key never goes to another base URL (issue 8.7)
    ep = resolve_endpoint("http://mine/v1/", None, env=both)
    assert (ep.base_url, ep.api_key, ep.family) == ("http://mine/v1", NO_KEY, "custom")
    assert resolve_endpoint("http://mine/v1", "sk-mine", env=both).api_key == "sk-mine"
    assert resolve_endpoint("http://openai-like/v1/", None, env=both).api_key == "sk-openai"
    assert resolve_endpoint(None, "sk-arg", env=router).api_key == "sk-arg"
    # a local server needs no key; OpenAI itself does
    assert resolve_endpoint("http://127.0.0.1:8080/v1", env={}).api_key == NO_KEY
    assert resolve_endpoint(env={"OPENAI_BASE_URL": "http://localhost:11434/v1"}).api_key == NO_KEY
    with pytest.raises(ValueError, match="no API key"):
        resolve_endpoint(env={})


def test_from_env_picks_model_and_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "OPENROUTER_BASE_URL",
        "OPENROUTER_API_KEY",
        "TETHER_MODEL",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or")
    model = OpenAICompatModel.from_env()
    assert (model.model, model.base_url) == ("anthropic/claude-haiku-4.5", OPENROUTER_BASE_URL)
    monkeypatch.setenv("TETHER_MODEL", "qwen/qwen3-8b")
    assert OpenAICompatModel.from_env().model == "qwen/qwen3-8b"
    assert OpenAICompatModel.from_env("explicit").model == "explicit"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-oa")
    monkeypatch.delenv("TETHER_MODEL")
    model = OpenAICompatModel.from_env()
    assert (model.model, model.base_url) == ("gpt-4o-mini", OPENAI_BASE_URL)


async def test_env_key_reaches_the_server(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "TETHER_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENROUTER_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-secret")
    server.push(chat_completion("hi"))
    await OpenAICompatModel.from_env("some/model").complete(ASK)
    request = server.requests[0]
    assert request.headers["authorization"] == "Bearer sk-or-secret"
    assert request.body["model"] == "some/model"


def test_fake_server_serves_json_for_plain_and_sse_for_stream_requests() -> None:
    # The helper the loop tests will reuse: one scripted completion, either transport.
    body = chat_completion("x", [tool_call("add", {"a": 1})])
    chunks = completion_chunks(body)
    assert chunks[-1]["usage"] == body["usage"] and chunks[-1]["choices"] == []
    rebuilt = "".join(
        tc["function"].get("arguments", "")
        for c in chunks
        for ch in c["choices"]
        for tc in ch["delta"].get("tool_calls", [])
    )
    assert json.loads(rebuilt) == {"a": 1}


# ----- tool choice, total deadline ----------------------------------------------------------------


@pytest.mark.parametrize(("choice", "sent"), [
    (None, None),
    ("auto", "auto"),
    ("none", "none"),
    ("required", "required"),
    ("add", {"type": "function", "function": {"name": "add"}}),
])
async def test_tool_choice_reaches_the_server(server: FakeOpenAIServer, choice: str | None, sent: object) -> None:
    server.push(chat_completion("ok"), chat_completion("ok"))
    model = make_model(server)
    request = ModelRequest(ASK.messages, tools=[ADD], tool_choice=choice)
    await model.complete(request)
    await collect(model, request)
    for seen in server.requests:
        assert seen.body.get("tool_choice") == sent
        assert seen.body["tools"][0]["function"]["name"] == "add"


async def test_tool_choice_without_tools_is_not_sent_and_unknown_names_are_refused(server: FakeOpenAIServer) -> None:
    server.push(chat_completion("ok"))
    await make_model(server).complete(ModelRequest(ASK.messages, tool_choice="none"))
    assert "tool_choice" not in server.requests[0].body and "tools" not in server.requests[0].body
    with pytest.raises(ValueError, match="neither auto, none, required nor one of the request's tools"):
        await make_model(server).complete(ModelRequest(ASK.messages, tools=[ADD], tool_choice="missing"))
    assert len(server.requests) == 1  # refused before anything was sent


@pytest.mark.parametrize("silent", [False, True], ids=["trickling", "silent"])
async def test_a_call_that_never_finishes_ends_at_its_deadline(silent: bool) -> None:
    from trickle_server import Trickler

    with Trickler(every=0.2, silent=silent) as slow:
        model = OpenAICompatModel("m", base_url=slow.base_url, api_key="k", deadline=1.0, timeout=30)
        with pytest.raises(ModelError, match=r"no complete reply within the 1s deadline"):
            await model.complete(ASK)
        with pytest.raises(ModelError, match=r"no complete reply within the 1s deadline"):
            await collect(model, ASK)
        assert slow.connections == 2  # one attempt each: the deadline, not a retry storm, ended them


async def test_retries_stop_at_the_deadline(server: FakeOpenAIServer) -> None:
    server.push(*[Reply.error(500, "down")] * 5)
    sleeps = SleepRecorder()
    model = make_model(server, deadline=5.0, backoff_base=10.0, backoff_max=10.0)
    model._sleep = sleeps
    with pytest.raises(ModelError, match=r"deadline.*last error: HTTP 500: down"):
        await model.complete(ASK)
    assert len(server.requests) == 1 and sleeps.delays == []  # a 5-10 s backoff would pass the 5 s deadline
