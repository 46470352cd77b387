"""Structured output: types and validation (pure), the loop with a scripted model, then real HTTP
against the fake OpenAI-compatible server (native `response_format`, or the final-result tool)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from hang import HANG
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from tether import Agent, BasePolicy, Limits, OutputInvalid, StopReason, structured, tool
from tether._output import FINAL_TOOL, JsonSchema, OutputRun, OutputType, parse_json, request_for
from tether._types import Message, ModelRequest, RunResult, Usage, from_json, to_json
from tether.models._openai_compat import OpenAICompatModel
from tether.models._scripted import ScriptedModel, call, reply


class City(BaseModel):
    """A city and its population."""

    name: str
    population: int = Field(ge=0)


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Movie(TypedDict):
    title: str
    year: int


@tool
def lookup(city: str) -> str:
    """Look a city's population up."""
    return f"{city}: 2,100,000 people"


# ----- compiling and validating (pure) --------------------------------------------------------------


@pytest.mark.parametrize(("tp", "wrapped"), [(City, False), (Point, False), (Movie, False), (int, True),
                                             (list[int], True), (City | Point, True), (str, True)])
def test_every_schema_root_is_an_object(tp: Any, wrapped: bool) -> None:
    kind = OutputType.of(tp)
    assert kind.wrapped is wrapped
    assert kind.schema.schema["type"] == "object"
    assert kind.schema.name == FINAL_TOOL
    if wrapped:
        assert kind.schema.schema["required"] == ["result"]


def test_nested_models_keep_their_defs_at_the_root() -> None:
    class Trip(BaseModel):
        stops: list[City]

    kind = OutputType.of(list[Trip])
    assert "$defs" in kind.schema.schema and "City" in kind.schema.schema["$defs"]
    assert kind.parse_text('{"result": [{"stops": [{"name": "Oslo", "population": 1}]}]}')[0].stops[0].name == "Oslo"


@pytest.mark.parametrize(("tp", "text", "expected"), [
    (City, '{"name": "Paris", "population": 2100000}', City(name="Paris", population=2100000)),
    (City, '```json\n{"name": "Paris", "population": 5}\n```', City(name="Paris", population=5)),
    (City, 'Here it is: {"name": "Paris", "population": 5}. Done.', City(name="Paris", population=5)),
    (Point, '{"x": 1, "y": 2}', Point(1, 2)),
    (Movie, '{"title": "Alien", "year": 1979}', {"title": "Alien", "year": 1979}),
    (int, '{"result": 42}', 42),
    (int, "42", 42),  # a bare value is accepted for a wrapped type
    (list[int], "[1, 2, 3]", [1, 2, 3]),
    (City | Point, '{"result": {"x": 1, "y": 2}}', Point(1, 2)),
    (Literal["yes", "no"], '"no"', "no"),
    (str, "Paris", "Paris"),  # str: plain text is the string
])
def test_valid_replies_parse(tp: Any, text: str, expected: Any) -> None:
    assert OutputType.of(tp).parse_text(text) == expected


def test_errors_name_the_field_what_was_expected_and_what_came() -> None:
    run = OutputRun(OutputType.of(City), retries=1)
    messages: list[Message] = []
    verdict = run.check(reply('{"name": "Paris", "population": "lots"}'), messages)
    assert verdict == "retry"
    assert run.errors == ['population: Input should be a valid integer, unable to parse string as an integer '
                          '(got "lots")']
    assert messages[-1].role == "user" and "population" in messages[-1].content and '"lots"' in messages[-1].content
    assert run.check(reply('{"population": -1}'), messages) == "invalid"
    assert run.errors == ["name: required field missing",
                          "population: Input should be greater than or equal to 0 (got -1)"]


def test_text_that_is_not_json_is_an_error() -> None:
    run = OutputRun(OutputType.of(City), retries=0)
    assert run.check(reply("I think Paris."), []) == "invalid"
    assert run.errors == ['(root): expected a JSON value matching the schema, got text "I think Paris."']
    assert run.text == "I think Paris."  # kept as the best partial answer


def test_raw_json_schema_output() -> None:
    kind = OutputType.of(JsonSchema({"type": "object", "properties": {"age": {"type": "integer"}},
                                     "required": ["age"]}))
    assert kind.parse_text('{"age": 3}') == {"age": 3}
    run = OutputRun(kind, retries=0)
    assert run.check(reply('{"age": "x"}'), []) == "invalid"
    assert run.errors == ["'age': expected integer, got 'x'"]
    with pytest.raises(ValueError, match="must be an object"):
        JsonSchema([1])  # type: ignore[arg-type]


def test_a_type_without_a_schema_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="has no JSON Schema"):
        Agent(ScriptedModel([]), output_type=type(lambda: 0))
    with pytest.raises(ValueError, match="retries"):
        Agent(ScriptedModel([]), output_type=int, output_retries=-1)


def test_parse_json_finds_the_value() -> None:
    assert parse_json('```\n[1]\n```') == [1]
    assert parse_json("nothing here") is not None  # the _NOT_JSON marker, not a value
    assert OutputType.of(int).schema.strict and OutputType.of(City).schema.strict  # all fields required: closed, strict


def test_request_for_uses_a_final_tool_only_without_native_support() -> None:
    schema = OutputType.of(City).schema
    request = ModelRequest([Message.user("x")], output_schema=schema)
    assert request_for(OpenAICompatModel("m", base_url="http://127.0.0.1:9/v1"), request) is request
    plain = request_for(ScriptedModel([]), request)
    assert plain.output_schema is None and plain.tool_choice == "required"
    assert [t.name for t in plain.tools] == [FINAL_TOOL] and plain.tools[0].parameters == schema.schema
    assert "population" in plain.tools[0].description
    # a call that may not use tools (the budget-stop final answer) must still give the answer
    no_tools = dataclasses.replace(request, tools=plain.tools[:0], tool_choice="none")
    assert request_for(ScriptedModel([]), no_tools).tool_choice == FINAL_TOOL


# ----- the loop (scripted model: no native support, so the final-result tool) ----------------------------


def test_valid_output_first_try_with_tools() -> None:
    model = ScriptedModel([call("lookup", city="Paris"), call(FINAL_TOOL, name="Paris", population=2100000)])
    result = Agent(model, tools=[lookup], output_type=City).run("How many live in Paris?")
    assert result.stop_reason is StopReason.COMPLETED
    assert result.output == City(name="Paris", population=2100000)
    assert json.loads(result.answer) == {"name": "Paris", "population": 2100000}
    assert result.steps == 2 and result.usage.tool_calls == 1
    assert result.messages[-1].role == "tool" and result.messages[-1].content == "Final result accepted."
    first = model.requests[0]
    names = [t.name for t in first.tools]
    assert names[0] == "lookup" and names[-1] == FINAL_TOOL
    assert first.tool_choice == "required"


def test_invalid_then_corrected() -> None:
    model = ScriptedModel([call(FINAL_TOOL, name="Paris", population="lots"),
                           call(FINAL_TOOL, name="Paris", population=5)])
    result = Agent(model, output_type=City).run("Paris?")
    assert result.completed and result.output == City(name="Paris", population=5)
    feedback = result.messages[2]
    assert feedback.role == "tool" and feedback.content.startswith("ERROR: ")
    assert 'population: Input should be a valid integer' in feedback.content and '"lots"' in feedback.content
    assert any(e.kind == "notice" and "output_invalid" in e.data for e in result.trace)


def test_invalid_until_the_retries_run_out() -> None:
    model = ScriptedModel(["Paris, about two million", '{"name": "Paris"}', '{"name": "Paris", "population": -3}'])
    result = Agent(model, output_type=City, output_retries=2).run("Paris?")
    assert result.stop_reason is StopReason.OUTPUT_INVALID
    assert result.output is None and not result.completed
    assert result.answer == '{"name": "Paris", "population": -3}'  # the best partial text is kept
    assert result.steps == 3 and result.usage.model_calls == 3  # each retry is a model call
    assert "no valid output after 3 attempt(s)" in (result.error or "")
    assert "greater than or equal to 0" in (result.error or "")


def test_retries_count_in_the_step_budget() -> None:
    model = ScriptedModel(["nope"] * 10)
    result = Agent(model, output_type=City, output_retries=5, limits=Limits(max_steps=2)).run("Paris?")
    assert result.stop_reason is StopReason.OUTPUT_INVALID
    assert "the run stopped at its limit: max_steps" in (result.error or "")
    assert result.steps == 2
    assert result.usage.model_calls == 3  # two steps and the reserved final-answer call


def test_a_budget_stop_can_still_end_with_valid_output() -> None:
    model = ScriptedModel([call("lookup", city="Paris"), call(FINAL_TOOL, name="Paris", population=7)])
    result = Agent(model, tools=[lookup], output_type=City, limits=Limits(max_steps=1)).run("Paris?")
    assert result.stop_reason is StopReason.MAX_STEPS  # honest about the stop...
    assert result.output == City(name="Paris", population=7)  # ...and the final call's answer validated


def test_other_calls_in_the_final_turn_are_answered_not_run() -> None:
    model = ScriptedModel([[call("lookup", city="Rome"), call(FINAL_TOOL, name="Rome", population=3)]])
    result = Agent(model, tools=[lookup], output_type=City).run("Rome?")
    assert result.completed and result.usage.tool_calls == 0
    tools = [m for m in result.messages if m.role == "tool"]
    assert [m.name for m in tools] == ["lookup", FINAL_TOOL]
    assert tools[0].content.startswith("ERROR: not run")


def test_plain_json_text_is_accepted_from_a_tool_mode_model() -> None:
    result = Agent(ScriptedModel(['{"x": 1, "y": 2}']), output_type=Point).run("a point")
    assert result.completed and result.output == Point(1, 2)


def test_without_output_type_output_is_the_answer() -> None:
    result = Agent(ScriptedModel(["hello"])).run("hi")
    assert result.output == "hello" and result.answer == "hello"


def test_run_result_with_output_round_trips_through_json() -> None:
    result = Agent(ScriptedModel(['{"name": "Oslo", "population": 1}']), output_type=City).run("x")
    back = from_json(RunResult, to_json(result))
    assert back.output == {"name": "Oslo", "population": 1} and back.stop_reason is StopReason.COMPLETED


def test_output_filter_redactions_are_validated_again() -> None:
    class Redacting(BasePolicy):  # a policy whose output filter rewrites the answer (as a secret filter would)
        def finish_run(self, state: Any, answer: str) -> tuple[str, list[Any]]:
            return answer.replace("2100000", "[redacted]"), [type("F", (), {"kind": "secret", "reason": "test"})()]

    agent = Agent(ScriptedModel(['{"name": "Paris", "population": 2100000}']), output_type=City,
                  policy=Redacting())
    result = agent.run("x")
    assert result.output is None and result.stop_reason is StopReason.OUTPUT_INVALID
    assert "[redacted]" in result.answer and "no longer validates" in (result.error or "")


# ----- over real HTTP: native response_format --------------------------------------------------------


def openai_model(server: FakeOpenAIServer, **kwargs: Any) -> OpenAICompatModel:
    return OpenAICompatModel("gpt-4o-mini", base_url=server.base_url, api_key="sk-test", backoff_base=0.001,
                             **kwargs)


def test_openai_sends_response_format_and_validates() -> None:
    with FakeOpenAIServer([chat_completion('{"name": "Paris", "population": 2100000}')]) as server:
        result = Agent(openai_model(server), output_type=City).run("Paris?")
    assert result.completed and result.output == City(name="Paris", population=2100000)
    body = server.requests[0].body
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == FINAL_TOOL and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["additionalProperties"] is False
    assert fmt["json_schema"]["schema"]["properties"]["population"]["type"] == "integer"
    assert "tools" not in body and "tool_choice" not in body


def test_openai_strict_schema_for_a_closed_type_and_wrapped_primitive() -> None:
    with FakeOpenAIServer([chat_completion('{"result": [3, 4]}')]) as server:
        result = Agent(openai_model(server), output_type=list[int]).run("two numbers")
    assert result.output == [3, 4]
    spec = server.requests[0].body["response_format"]["json_schema"]
    assert spec["strict"] is True and spec["schema"]["required"] == ["result"]


def test_openai_invalid_then_corrected_over_http() -> None:
    script = [chat_completion('{"name": "Paris", "population": "lots"}'),
              chat_completion('{"name": "Paris", "population": 5}')]
    with FakeOpenAIServer(script) as server:
        result = Agent(openai_model(server), output_type=City).run("Paris?")
    assert result.completed and result.output == City(name="Paris", population=5)
    second = server.requests[1].body["messages"]
    assert second[-2] == {"role": "assistant", "content": '{"name": "Paris", "population": "lots"}'}
    assert second[-1]["role"] == "user" and "population" in second[-1]["content"]
    assert "Reply again with only the corrected JSON" in second[-1]["content"]
    assert server.requests[1].body["response_format"] == server.requests[0].body["response_format"]


def test_openai_invalid_until_retries_run_out_over_http() -> None:
    with FakeOpenAIServer(responder=lambda r: chat_completion("Paris has many people.")) as server:
        result = Agent(openai_model(server), output_type=City, output_retries=1).run("Paris?")
    assert result.stop_reason is StopReason.OUTPUT_INVALID and result.output is None
    assert len(server.requests) == 2 and result.answer == "Paris has many people."


def test_openai_without_native_support_gets_the_final_tool_over_http() -> None:
    script = [chat_completion(None, [tool_call(FINAL_TOOL, {"name": "Paris", "population": "x"})]),
              chat_completion(None, [tool_call(FINAL_TOOL, {"name": "Paris", "population": 9}, id="call_2")])]
    with FakeOpenAIServer(script) as server:
        model = openai_model(server)
        model.native_output = False  # a server without response_format
        result = Agent(model, output_type=City).run("Paris?")
    assert result.completed and result.output == City(name="Paris", population=9)
    first = server.requests[0].body
    assert "response_format" not in first
    assert first["tools"][-1]["function"]["name"] == FINAL_TOOL
    assert first["tools"][-1]["function"]["parameters"]["required"] == ["name", "population"]
    tool_msg = server.requests[1].body["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call_1"
    assert tool_msg["content"].startswith("ERROR: ") and "population" in tool_msg["content"]


def test_streamed_structured_output() -> None:
    with FakeOpenAIServer([chat_completion('{"x": 5, "y": 6}')]) as server:
        agent = Agent(openai_model(server), output_type=Point)

        async def go() -> RunResult[Point]:
            return await agent.arun("a point", stream_text=True)

        result = asyncio.run(go())
    assert result.output == Point(5, 6) and server.requests[0].body["stream"] is True


# ----- one-off structured calls ---------------------------------------------------------------------


async def test_structured_call_over_http() -> None:
    script = [chat_completion('{"title": "Alien", "year": "old"}', prompt_tokens=100, completion_tokens=10,
                              model="gpt-4o-mini"),
              chat_completion('{"title": "Alien", "year": 1979}', prompt_tokens=120, completion_tokens=10,
                              model="gpt-4o-mini")]
    usage = Usage()
    with FakeOpenAIServer(script) as server:
        movie = await structured(openai_model(server), "Best 1979 film?", Movie, instructions="Be exact.",
                                 usage=usage)
    assert movie == {"title": "Alien", "year": 1979}
    assert usage.model_calls == 2 and usage.input_tokens == 220
    assert usage.cost_usd == pytest.approx((220 * 0.15 + 20 * 0.60) / 1e6)  # priced as gpt-4o-mini
    first = server.requests[0].body
    assert first["messages"][0] == {"role": "system", "content": "Be exact."} and "tools" not in first


async def test_structured_call_raises_after_its_retries() -> None:
    with FakeOpenAIServer(responder=lambda r: chat_completion("[1, 2]")) as server, \
            pytest.raises(OutputInvalid) as info:
        await structured(openai_model(server), "a movie", Movie, retries=1)
    assert info.value.attempts == 2 and info.value.text == "[1, 2]" and len(server.requests) == 2
    assert "expected" in str(info.value) or "valid" in str(info.value)


async def test_structured_call_through_the_final_tool() -> None:
    model = ScriptedModel([call("search", q="x"), call(FINAL_TOOL, result=7)])
    assert await structured(model, "a number", int) == 7
    assert model.requests[0].tools[0].name == FINAL_TOOL  # the only tool offered
    retry = model.requests[1].messages
    assert retry[-2].role == "tool" and retry[-2].content.startswith("ERROR: not run")
    assert retry[-1].role == "user" and "no tools are available" in retry[-1].content


# ----- the CLI ----------------------------------------------------------------------------------------


def _cli_env(server: FakeOpenAIServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_",
                                                                     "ANTHROPIC_"))}
    return env | {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}


def test_cli_output_schema_prints_the_validated_json(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"city": {"type": "string"},
                                                                    "people": {"type": "integer"}},
                                  "required": ["city", "people"]}))
    script = [chat_completion('Sure! {"city": "Paris", "people": "many"}'),
              chat_completion('{"city": "Paris", "people": 2100000}')]
    with FakeOpenAIServer(script) as server:
        proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "Paris?", "--tools", "none",
                               "--output-schema", str(schema)], cwd=tmp_path, env=_cli_env(server),
                              capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"city": "Paris", "people": 2100000}
    assert server.requests[0].body["response_format"]["json_schema"]["schema"]["required"] == ["city", "people"]


def test_cli_output_schema_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "x", "--output-schema", str(bad)],
                          cwd=tmp_path, env=_cli_env_static(), capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "not a valid JSON Schema" in proc.stderr

    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "integer"}))
    with FakeOpenAIServer(responder=lambda r: chat_completion("no idea")) as server:
        proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "x", "--tools", "none",
                               "--output-schema", str(schema)], cwd=tmp_path, env=_cli_env(server),
                              capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 1 and proc.stdout == ""  # nothing unvalidated reaches stdout
    assert "no valid output after 3 attempt(s)" in proc.stderr and "no answer" in proc.stderr


def _cli_env_static() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_"))}
    return env | {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}


def test_strict_mode_is_on_for_plain_classes_whose_schema_allows_it() -> None:
    """Issue 24, item 9: a dataclass, a TypedDict or a plain pydantic model with required fields is
    sent with `strict: true` (closed objects), so OpenAI enforces the schema; optional fields keep it
    off (strict mode would demand every key)."""
    import dataclasses

    from pydantic import BaseModel
    from typing_extensions import TypedDict

    from tether._output import OutputType

    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    class Box(TypedDict):
        name: str
        corner: Point

    class City(BaseModel):
        name: str
        population: int

    class Loose(BaseModel):
        name: str
        note: str = ""

    for tp in (Point, Box, City, list[City]):
        out = OutputType.of(tp).schema
        assert out.strict, tp
        assert out.schema["additionalProperties"] is False
    assert not OutputType.of(Loose).schema.strict
    assert OutputType.of(Box).validate({"name": "a", "corner": {"x": 1, "y": 2}})["corner"].y == 2
