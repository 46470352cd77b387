"""The whole loop over real HTTP: the official openai SDK against a server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
from fake_openai_server import FakeOpenAIServer, Reply, chat_completion, tool_call
from hang import HANG

from tether import Agent, Limits, StopReason, tool
from tether.models._openai_compat import OpenAICompatModel
from tether.tools.builtin import calculator


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model_for(server: FakeOpenAIServer) -> OpenAICompatModel:
    return OpenAICompatModel("gpt-4o-mini", base_url=server.base_url, api_key="k", backoff_base=0.001)


def test_tool_call_then_answer_with_a_500_a_429_and_malformed_arguments_on_the_way():
    script = [
        Reply.error(500, "overloaded"),
        chat_completion(None, [tool_call("add", '{"a": 2, "b": ')], prompt_tokens=50, completion_tokens=10, model="gpt-4o-mini"),  # malformed
        Reply.error(429, "slow down", headers={"Retry-After": "0"}),
        chat_completion(None, [tool_call("add", {"a": 2, "b": 40}, id="call_2")], prompt_tokens=80, completion_tokens=10, model="gpt-4o-mini"),
        chat_completion("2 + 40 = 42", prompt_tokens=100, completion_tokens=8, model="gpt-4o-mini"),
    ]
    with FakeOpenAIServer(script) as server:
        result = Agent(model_for(server), tools=[add]).run("What is 2 + 40?")
        bodies = [r.body for r in server.requests]
    assert result.stop_reason is StopReason.COMPLETED
    assert result.answer == "2 + 40 = 42"
    assert result.usage.input_tokens == 230 and result.usage.model_calls == 3
    assert result.usage.cost_usd > 0  # gpt-4o-mini is in the price table
    assert len(bodies) == 5  # two retried errors + three model calls
    # The model saw an actionable error for its malformed call, then the real result.
    tool_msgs = [m for m in bodies[3]["messages"] if m["role"] == "tool"]
    assert "invalid arguments for 'add'" in tool_msgs[0]["content"]
    last_tools = [m for m in bodies[4]["messages"] if m["role"] == "tool"]
    assert last_tools[-1] == {"role": "tool", "tool_call_id": "call_2", "content": "42"}
    assert bodies[4]["tools"][0]["function"]["name"] == "add"


def test_endless_tool_calling_model_ends_in_bounded_steps():
    n = 0

    def endless(request):
        nonlocal n
        n += 1
        if request.body.get("tool_choice") == "none":
            return chat_completion("Partial: I computed several sums but never finished.")
        return chat_completion(None, [tool_call("calculator", {"expression": f"{n} + 1"}, id=None)])

    with FakeOpenAIServer(responder=endless) as server:
        result = Agent(model_for(server), tools=[calculator], limits=Limits(max_steps=6)).run("Never stop")
        bodies = [r.body for r in server.requests]
    assert result.stop_reason is StopReason.MAX_STEPS
    assert len(bodies) == 7  # 6 steps + the reserved tool-free call
    # the reserved call keeps the tools declared (Anthropic refuses tool calls in history otherwise)
    assert bodies[-1]["tool_choice"] == "none" and bodies[-1]["tools"] == bodies[0]["tools"]
    assert result.answer.startswith("Partial:")
    assert len(result.findings) == 5  # the 6th step's call was never run


def test_endless_identical_calls_stop_as_a_loop():
    def same(request):
        if request.body.get("tool_choice") == "none":
            return chat_completion("I was stuck.")
        return chat_completion(None, [tool_call("add", {"a": 1, "b": 1}, id=None)])

    with FakeOpenAIServer(responder=same) as server:
        result = Agent(model_for(server), tools=[add], limits=Limits(max_steps=50)).run("loop")
        notices = [m for m in server.requests[-1].body["messages"] if m["role"] == "tool"]
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert result.usage.tool_calls == 3
    assert any(m["content"].startswith("NOTICE") for m in notices)
    assert result.answer == "I was stuck."


def test_streamed_run_emits_text_deltas():
    import asyncio

    script = [chat_completion("Hello there, streaming works", prompt_tokens=5, completion_tokens=5, model="gpt-4o-mini")]

    async def collect(server):
        agent = Agent(model_for(server))
        return [item async for item in agent.stream("hi")]

    with FakeOpenAIServer(script) as server:
        items = asyncio.run(collect(server))
        assert server.requests[0].body["stream"] is True
    deltas = "".join(i.data["text"] for i in items[:-1] if getattr(i, "kind", "") == "text_delta")
    assert deltas == "Hello there, streaming works"
    assert items[-1].answer == deltas
    json.dumps([getattr(i, "data", None) for i in items[:-1]])  # events are plain data


def test_repeated_sync_runs_leave_nothing_to_close_on_a_closed_loop(tmp_path) -> None:
    """Issue 24, item 9: from the second `agent.run()` on one model, stderr got "Task exception was
    never retrieved ... Event loop is closed" (the first loop's HTTP client closed after its loop)."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "runs.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from fake_openai_server import FakeOpenAIServer, chat_completion\n"
        "from tether import Agent\n"
        "from tether.models._openai_compat import OpenAICompatModel\n"
        "with FakeOpenAIServer([], responder=lambda r: chat_completion('hi')) as s:\n"
        "    agent = Agent(OpenAICompatModel('gpt-4o-mini', base_url=s.base_url, api_key='k'))\n"
        "    print([agent.run('x').answer for _ in range(3)])\n"
        "    import gc; gc.collect()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['hi', 'hi', 'hi']"
    assert out.stderr == "", out.stderr


async def test_run_inside_a_running_loop_names_arun() -> None:
    from tether import Agent
    from tether.models._scripted import ScriptedModel

    with pytest.raises(RuntimeError, match=r"await agent\.arun"):
        Agent(ScriptedModel(["x"])).run("hi")
