"""Structured output with Anthropic: a forced final tool, over real HTTP (the anthropic SDK against
the fake server's /v1/messages)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer, Reply
from pydantic import BaseModel

from tether import Agent, StopReason, structured, tool
from tether._output import FINAL_TOOL

pytest.importorskip("anthropic", reason="the anthropic extra is not installed")

from tether._output import OutputType
from tether._types import Message, ModelRequest, ToolSpec
from tether.models._anthropic import AnthropicModel, force_output_tool


class City(BaseModel):
    name: str
    population: int


@tool
def lookup(city: str) -> str:
    """Look a city's population up."""
    return f"{city}: 2,100,000 people"


def message(*content: dict[str, Any], stop_reason: str = "tool_use") -> Reply:
    return Reply.json({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": list(content), "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 12},
    })


def tool_use(name: str, input: dict[str, Any], id: str = "toolu_1") -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def model_for(server: FakeOpenAIServer) -> AnthropicModel:
    return AnthropicModel("claude-haiku-4-5", api_key="sk-ant-test", base_url=server.root_url, backoff_base=0.001)


def test_no_tools_forces_the_final_tool() -> None:
    with FakeOpenAIServer([message(tool_use(FINAL_TOOL, {"name": "Paris", "population": 2100000}))]) as server:
        result = Agent(model_for(server), output_type=City).run("Paris?")
    assert result.completed and result.output == City(name="Paris", population=2100000)
    body = server.requests[0].body
    assert body["tool_choice"] == {"type": "tool", "name": FINAL_TOOL}
    final = body["tools"][-1]
    assert final["name"] == FINAL_TOOL and final["input_schema"]["properties"]["population"]["type"] == "integer"
    assert result.usage.cost_usd == pytest.approx((30 * 1.0 + 12 * 5.0) / 1e6)


def test_with_tools_any_tool_must_be_used_and_invalid_input_is_corrected() -> None:
    script = [
        message(tool_use("lookup", {"city": "Paris"})),
        message(tool_use(FINAL_TOOL, {"name": "Paris", "population": "2.1 million"}, id="toolu_2")),
        message(tool_use(FINAL_TOOL, {"name": "Paris", "population": 2100000}, id="toolu_3")),
    ]
    with FakeOpenAIServer(script) as server:
        result = Agent(model_for(server), tools=[lookup], output_type=City).run("How many live in Paris?")
    assert result.stop_reason is StopReason.COMPLETED
    assert result.output == City(name="Paris", population=2100000)
    first = server.requests[0].body
    assert first["tool_choice"] == {"type": "any"}
    assert first["tools"][0]["name"] == "lookup" and first["tools"][-1]["name"] == FINAL_TOOL
    feedback = server.requests[2].body["messages"][-1]
    assert feedback["role"] == "user"
    block = feedback["content"][0]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_2"
    assert "population" in block["content"] and '"2.1 million"' in block["content"]


def test_invalid_until_the_retries_run_out() -> None:
    bad = message(tool_use(FINAL_TOOL, {"name": "Paris"}))
    with FakeOpenAIServer(responder=lambda r: bad) as server:
        result = Agent(model_for(server), output_type=City, output_retries=1).run("Paris?")
    assert result.stop_reason is StopReason.OUTPUT_INVALID and result.output is None
    assert len(server.requests) == 2
    assert result.answer == '{"name": "Paris"}' and "population: required field missing" in (result.error or "")


async def test_structured_call() -> None:
    with FakeOpenAIServer([message(tool_use(FINAL_TOOL, {"result": ["a", "b"]}))]) as server:
        assert await structured(model_for(server), "two letters", list[str]) == ["a", "b"]
    assert server.requests[0].body["tool_choice"] == {"type": "tool", "name": FINAL_TOOL}


def test_tools_that_may_not_be_called_leave_only_the_final_tool_forced() -> None:
    spec = ToolSpec("lookup", "Look up.", {"type": "object", "properties": {}})
    request = ModelRequest([Message.user("x")], [spec], tool_choice="none",
                           output_schema=OutputType.of(City).schema)
    params: dict[str, Any] = {"tools": [{"name": "lookup"}]}
    force_output_tool(params, request)
    assert params["tool_choice"] == {"type": "tool", "name": FINAL_TOOL}
    assert [t["name"] for t in params["tools"]] == ["lookup", FINAL_TOOL]
