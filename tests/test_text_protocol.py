"""Text tool-call protocols (tagged JSON and ReAct) for models that only produce text."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import Agent, Limits, StopReason, tool
from tether._types import Message, ModelReply, ModelRequest, TextDelta, ToolCall, ToolSpec, Usage
from tether.models._base import Model, stream_by_completing
from tether.models._text_protocol import (
    TextProtocolModel,
    parse_react,
    parse_reply,
    parse_tagged,
    render_call,
    render_messages,
    render_tools_prompt,
)

ADD = ToolSpec("add", "Add two integers.", {
    "title": "AddArgs", "type": "object",
    "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
    "required": ["a", "b"],
})
SEARCH = ToolSpec("search", "Search the web\n  for a query.", {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
})
TOOLS = [ADD, SEARCH]


class TextModel:
    """A raw text model: replies come from a list (or a function of the request), in order."""

    name = "text-fake"

    def __init__(self, script: list[str] | Callable[[ModelRequest], str]) -> None:
        self.script = script
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelReply:
        assert not request.tools, "a text model must never be sent native tools"
        self.requests.append(request)
        text = self.script(request) if callable(self.script) else self.script[len(self.requests) - 1]
        return ModelReply(text, usage=Usage(input_tokens=10, output_tokens=3, model_calls=1),
                          model="fake-1", finish_reason="stop")

    def stream(self, request: ModelRequest):
        return stream_by_completing(self, request)


def request(tools: list[ToolSpec] = TOOLS, *history: Message) -> ModelRequest:
    messages = [Message.system("Be brief."), Message.user("What is 2 + 3?"), *history]
    return ModelRequest(messages, list(tools))


def complete(model: Model, req: ModelRequest) -> ModelReply:
    return asyncio.run(model.complete(req))


# ---------------------------------------------------------------- tagged JSON


def test_tagged_single_call_and_what_the_inner_model_sees():
    inner = TextModel(['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'])
    reply = complete(TextProtocolModel(inner), request())
    assert [(c.id, c.name, c.arguments, c.parse_error) for c in reply.tool_calls] == [
        ("call_1", "add", {"a": 2, "b": 3}, None)]
    assert reply.finish_reason == "tool_calls"
    assert reply.model == "fake-1"
    sent = inner.requests[0]
    assert [m.role for m in sent.messages] == ["system", "user"]
    system = sent.messages[0].content
    assert system.startswith("Be brief.\n\n")
    assert '- add: Add two integers.\n  arguments: {"type":"object","properties":{"a":{"type":"integer"}' in system
    assert "- search: Search the web for a query." in system  # descriptions on one line
    assert '"title"' not in system
    assert '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>' in system  # worked example
    assert "<final>" in system
    assert "<tool_result" in sent.stop


def test_tagged_several_calls_keep_prose_as_text():
    text = ('I will add, then search.\n'
            '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": {"query": "five"}}</tool_call>')
    reply = complete(TextProtocolModel(TextModel([text])), request())
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_1", "add", {"a": 2, "b": 3}), ("call_2", "search", {"query": "five"})]
    assert reply.text == "I will add, then search."


def test_tagged_final_answer():
    reply = complete(TextProtocolModel(TextModel(["Thinking done.\n<final>It is 5.</final>"])), request())
    assert (reply.text, reply.tool_calls, reply.finish_reason) == ("It is 5.", [], "stop")


def test_tagged_tolerates_fences_missing_tags_and_string_arguments():
    fenced = parse_tagged('<tool_call>\n```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```\n</tool_call>')
    assert [(c.name, c.arguments) for c in fenced.calls] == [("add", {"a": 1, "b": 2})]
    bare = parse_tagged('```json\n{"name": "search", "arguments": {"query": "x"}}\n```')
    assert [(c.name, c.arguments) for c in bare.calls] == [("search", {"query": "x"})]
    unclosed = parse_tagged('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}  trailing words')
    assert [(c.name, c.arguments) for c in unclosed.calls] == [("add", {"a": 1, "b": 2})]
    assert unclosed.text == "trailing words"
    as_string = parse_tagged('<tool_call>{"name": "add", "arguments": "{\\"a\\": 4, \\"b\\": 5}"}</tool_call>')
    assert [(c.name, c.arguments) for c in as_string.calls] == [("add", {"a": 4, "b": 5})]
    quoted = parse_tagged("<tool_call>{'name': 'add', 'arguments': {'a': 1, 'b': 2,},}</tool_call>")
    assert [(c.name, c.arguments, c.parse_error) for c in quoted.calls] == [("add", {"a": 1, "b": 2}, None)]
    unclosed_final = parse_tagged("<final>the end")
    assert unclosed_final.final == "the end"


def test_tagged_json_strings_may_contain_the_tags():
    parsed = parse_tagged('<tool_call>{"name": "search", "arguments": {"query": "</tool_call> <tool_result"}}'
                          "</tool_call>")
    assert [c.arguments for c in parsed.calls] == [{"query": "</tool_call> <tool_result"}]


def test_tagged_invented_tool_results_are_dropped():
    parsed = parse_tagged('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
                          '<tool_result name="add" id="call_1">3</tool_result>\n'
                          '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 3}}</tool_call><final>6</final>')
    assert [c.arguments for c in parsed.calls] == [{"a": 1, "b": 2}]
    assert parsed.final is None


def test_tagged_malformed_json_becomes_parse_error():
    parsed = parse_tagged('<tool_call>{"name": "add", "arguments": {"a": 1 "b": 2}}</tool_call>')
    (call,) = parsed.calls
    assert call.name == "add" and call.arguments == {}
    assert call.parse_error and "not valid JSON" in call.parse_error
    assert call.raw_arguments == '{"a": 1 "b": 2}'
    not_object = parse_tagged('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>').calls[0]
    assert not_object.parse_error == "arguments must be a JSON object"
    bad_string = parse_tagged('<tool_call>{"name": "add", "arguments": "a=1"}</tool_call>').calls[0]
    assert bad_string.parse_error and bad_string.raw_arguments == '"a=1"'
    nameless = parse_tagged("<tool_call>not json at all</tool_call>")
    assert nameless.calls == [] and nameless.errors and not nameless.follows_protocol


def test_tagged_parse_error_reaches_the_executor_as_a_correctable_error():
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    script = iter(['<tool_call>{"name": "add", "arguments": {"a": 2, "b" 3}}</tool_call>',
                   '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                   "<final>5</final>"])
    inner = TextModel(lambda req: next(script))
    result = Agent(TextProtocolModel(inner), tools=[add], limits=Limits(max_steps=5)).run("2+3?")
    assert result.stop_reason is StopReason.COMPLETED and result.answer == "5"
    second_prompt = inner.requests[1].messages[-1].content
    assert second_prompt.startswith('<tool_result name="add" id="call_1">\nERROR: invalid arguments for \'add\'')
    assert inner.requests[2].messages[-1].content == '<tool_result name="add" id="call_2">\n5\n</tool_result>'


# ---------------------------------------------------------------- ReAct


def test_react_single_call_with_thought():
    text = 'Thought: I should add.\nAction: add\nAction Input: {"a": 2, "b": 3}'
    inner = TextModel([text])
    reply = complete(TextProtocolModel(inner, "react"), request())
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("call_1", "add", {"a": 2, "b": 3})]
    assert reply.text == "Thought: I should add."
    system = inner.requests[0].messages[0].content
    assert "Action: the tool to use, one of [add, search]" in system
    assert 'Action: add\nAction Input: {"a": 1, "b": 1}' in system
    assert "\nObservation" in inner.requests[0].stop


def test_react_several_calls_and_invented_observation_dropped():
    text = ('Thought: two things.\n**Action:** add\n**Action Input:** ```json\n{"a": 1, "b": 2}\n```\n'
            'Action: search\nAction Input: {"query": "q"} because I want to\n'
            "Observation: 3\nAction: add\nAction Input: {}\nFinal Answer: made up")
    parsed = parse_react(text)
    assert [(c.id, c.name, c.arguments) for c in parsed.calls] == [
        ("call_1", "add", {"a": 1, "b": 2}), ("call_2", "search", {"query": "q"})]
    assert parsed.final is None


def test_react_final_answer():
    reply = complete(TextProtocolModel(TextModel(["Thought: easy.\nFinal Answer: 5\nsecond line"]), "react"),
                     request())
    assert (reply.text, reply.tool_calls) == ("5\nsecond line", [])


def test_react_malformed_input_and_plain_string_input():
    (bad,) = parse_react("Action: add\nAction Input: {a: 1, b: 2").calls
    assert bad.name == "add" and bad.parse_error and bad.parse_error.startswith("Action Input:")
    assert bad.raw_arguments == "{a: 1, b: 2"
    # a tool taking one string parameter gets a plain input as that parameter
    (plain,) = parse_react("Action: search\nAction Input: best pizza in Rome", tools=TOOLS).calls
    assert (plain.arguments, plain.parse_error) == ({"query": "best pizza in Rome"}, None)
    (no_tools,) = parse_react("Action: search\nAction Input: best pizza").calls
    assert no_tools.parse_error is not None
    (inline,) = parse_react('Action: add {"a": 1, "b": 1}').calls
    assert inline.arguments == {"a": 1, "b": 1}
    assert parse_react("Action Input: {}").errors == ["an Action Input must follow an Action"]


# ---------------------------------------------------------------- nudges and tool-free calls


@pytest.mark.parametrize("protocol, good", [
    ("tagged", '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'),
    ("react", 'Action: add\nAction Input: {"a": 2, "b": 3}'),
])
def test_nudge_then_success(protocol, good):
    inner = TextModel(["Sure, I can help with that.", good])
    reply = complete(TextProtocolModel(inner, protocol), request())
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("call_1", "add", {"a": 2, "b": 3})]
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.model_calls) == (20, 6, 2)
    first, second = inner.requests
    assert second.messages[:-2] == first.messages
    assert second.messages[-2] == Message.assistant("Sure, I can help with that.")
    nudge = second.messages[-1]
    assert nudge.role == "user" and "did not follow the format" in nudge.content and "add, search" in nudge.content


def test_nudge_names_the_unreadable_block():
    inner = TextModel(["<tool_call>add 2 and 3</tool_call>", "<final>5</final>"])
    reply = complete(TextProtocolModel(inner), request())
    assert reply.text == "5"
    assert "could not read the <tool_call> block" in inner.requests[1].messages[-1].content


@pytest.mark.parametrize("max_nudges", [0, 2])
def test_nudges_exhausted_plain_text_is_the_answer(max_nudges):
    replies = [f"just words {i}" for i in range(max_nudges + 1)]
    inner = TextModel(replies)
    reply = complete(TextProtocolModel(inner, max_nudges=max_nudges), request())
    assert (reply.text, reply.tool_calls) == (replies[-1], [])
    assert len(inner.requests) == max_nudges + 1
    assert reply.usage.input_tokens == 10 * (max_nudges + 1)


@pytest.mark.parametrize("protocol, text, answer", [
    ("tagged", "<final>It is 5.</final>", "It is 5."),
    ("tagged", "It is 5.", "It is 5."),
    ("react", "Thought: done\nFinal Answer: It is 5.", "It is 5."),
    ("react", "It is 5.", "It is 5."),
])
def test_tool_free_request_asks_for_plain_text(protocol, text, answer):
    inner = TextModel([text])
    reply = complete(TextProtocolModel(inner, protocol), request([]))
    assert (reply.text, reply.tool_calls) == (answer, [])
    assert len(inner.requests) == 1  # plain text is fine here: no nudge
    sent = inner.requests[0]
    assert "No tools are available now" in sent.messages[0].content
    assert "add" not in sent.messages[0].content and sent.stop == []


def test_stream_yields_text_then_reply():
    async def collect():
        model = TextProtocolModel(TextModel(["<final>hi</final>"]))
        return [item async for item in model.stream(request())]

    items = asyncio.run(collect())
    assert isinstance(items[0], TextDelta) and items[0].text == "hi"
    assert isinstance(items[-1], ModelReply) and items[-1].text == "hi"


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="unknown text protocol"):
        TextProtocolModel(TextModel([]), "xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_nudges"):
        TextProtocolModel(TextModel([]), max_nudges=-1)
    assert isinstance(TextProtocolModel(TextModel([])), Model)


# ---------------------------------------------------------------- rendering a multi-step history


def history() -> list[Message]:
    c1 = ToolCall("call_1", "add", {"a": 2, "b": 3})
    c2 = ToolCall("call_2", "search", {"query": "five"})
    c3 = ToolCall("call_3", "add", {}, parse_error="not valid JSON", raw_arguments='{"a": 5 "b": 1}')
    return [
        Message.system("Be brief."),
        Message.user("Add 2 and 3, then look it up."),
        Message.assistant("Two calls.", [c1, c2]),
        Message("tool", "5", tool_call_id="call_1", name="add"),
        Message("tool", "five is a number", tool_call_id="call_2"),  # name found from the call
        Message.assistant("", [c3]),
        Message("tool", "ERROR: invalid arguments", tool_call_id="call_3", name="add"),
        Message.user("Please finish."),
    ]


def test_render_tagged_history():
    out = render_messages(history(), "tagged")
    assert [(m.role, m.content) for m in out] == [
        ("system", "Be brief."),
        ("user", "Add 2 and 3, then look it up."),
        ("assistant", 'Two calls.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
                      '<tool_call>{"name": "search", "arguments": {"query": "five"}}</tool_call>'),
        ("user", '<tool_result name="add" id="call_1">\n5\n</tool_result>\n\n'
                 '<tool_result name="search" id="call_2">\nfive is a number\n</tool_result>'),
        ("assistant", '<tool_call>{"name": "add", "arguments": {"a": 5 "b": 1}}</tool_call>'),
        ("user", '<tool_result name="add" id="call_3">\nERROR: invalid arguments\n</tool_result>\n\n'
                 "Please finish."),
    ]
    assert render_messages(history(), "tagged") == out  # deterministic


def test_render_react_history_and_prompt_placement():
    out = render_messages(history(), "react", TOOLS)
    assert [m.role for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert out[0].content.startswith("Be brief.\n\nYou can use these tools:")
    assert out[2].content == ('Two calls.\nAction: add\nAction Input: {"a": 2, "b": 3}\n'
                              'Action: search\nAction Input: {"query": "five"}')
    assert out[3].content == "Observation: 5\n\nObservation: five is a number"
    assert out[4].content == 'Action: add\nAction Input: {"a": 5 "b": 1}'
    no_system = render_messages([Message.user("hi"), Message.assistant("hello")], "react", [])
    assert [(m.role, m.content) for m in no_system] == [
        ("system", render_tools_prompt([], "react")), ("user", "hi"), ("assistant", "Final Answer: hello")]


@pytest.mark.parametrize("protocol", ["tagged", "react"])
def test_rendered_history_parses_back_to_the_same_calls(protocol):
    messages = history()
    rendered = render_messages(messages, protocol)
    originals = [m for m in messages if m.role == "assistant"]
    again = [m for m in rendered if m.role == "assistant"]
    for orig, text in zip(originals, again, strict=True):
        parsed = parse_reply(text.content, protocol)
        assert [(c.name, c.arguments, c.parse_error is None) for c in parsed.calls] == [
            (c.name, c.arguments, c.parse_error is None) for c in orig.tool_calls]
        assert parsed.text == orig.content


def test_call_ids_continue_from_the_history_and_avoid_clashes():
    earlier = [Message.assistant("", [ToolCall("call_2", "add", {"a": 1, "b": 1})]),
               Message("tool", "2", tool_call_id="call_2", name="add")]
    inner = TextModel(['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
                       '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 3}}</tool_call>'])
    reply = complete(TextProtocolModel(inner), request(TOOLS, *earlier))
    assert [c.id for c in reply.tool_calls] == ["call_3", "call_4"]


def test_multi_step_run_through_the_agent_reads_naturally():
    """A real run: the executor's results reach the text model, which answers from them."""

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    def fake_llm(req: ModelRequest) -> str:
        last = req.messages[-1].content
        results = re.findall(r'<tool_result name="multiply" id="(call_\d+)">\n(-?\d+)\n', last)
        if not results:
            return ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
                    '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 3}}</tool_call>')
        return f"<final>{' and '.join(f'{cid}={value}' for cid, value in results)}</final>"

    inner = TextModel(fake_llm)
    result = Agent(TextProtocolModel(inner), tools=[multiply], instructions="Use tools.").run("6*7 and 3*3?")
    assert result.stop_reason is StopReason.COMPLETED
    assert result.answer == "call_1=42 and call_2=9"
    assert result.usage.input_tokens == 20


def test_runaway_reply_is_capped():
    block = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    parsed = parse_tagged(block * 150)
    assert len(parsed.calls) == 100
    assert parsed.errors == ["more than 100 <tool_call> blocks; the rest were ignored"]


@pytest.mark.parametrize("text", [
    "\n" + " " * 50_000 + "x",  # once quadratic in the ReAct header pattern
    "Action" + " " * 50_000 + "x",
    "```" + " " * 50_000 + "x",
    "<tool_call>{" * 20_000,
    "<tool_call>{}<tool_result" * 5_000,
    "'" * 50_000 + '"' * 50_000,
])
def test_pathological_replies_parse(text):
    # no timing assertion (numbers belong in bench/); a regression shows up as a test taking seconds
    for parsed in (parse_tagged(text), parse_react(text)):
        assert len(parsed.calls) <= 100


# ---------------------------------------------------------------- properties

protocol_text = st.lists(st.one_of(
    st.text(max_size=20),
    st.sampled_from(["<tool_call>", "</tool_call>", "<final>", "</final>", "<tool_result>", "```json\n", "```",
                     "\nThought:", "\nAction:", "\nAction Input:", "\nObservation:", "\nFinal Answer:",
                     "**Action:**", "{", "}", "[", "]", '"', "'", ":", ",", '"name"', '"arguments"',
                     "True", "\\", '{"name": "add", "arguments": ', "[" * 3000]),
), max_size=25).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), protocol_text))
def test_parsers_never_raise(text):
    for parsed in (parse_tagged(text), parse_react(text), parse_react(text, tools=TOOLS)):
        assert isinstance(parsed.text, str)
        for c in parsed.calls:
            assert c.name and isinstance(c.arguments, dict)
            assert (c.parse_error is None) or (c.arguments == {})


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=200), protocol_text), st.sampled_from(["tagged", "react"]))
def test_wrapper_never_raises_on_any_reply(text, protocol):
    reply = complete(TextProtocolModel(TextModel(lambda req: text), protocol), request())
    assert reply.tool_calls or isinstance(reply.text, str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,24}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(names, st.dictionaries(st.text(), json_values, max_size=5), st.sampled_from(["tagged", "react"]),
       st.text(alphabet=st.characters(exclude_characters="<"), max_size=30).filter(lambda s: ":" not in s))
def test_render_then_parse_round_trips(name, arguments, protocol, prose):
    call = ToolCall("call_9", name, arguments)
    text = render_messages([Message.assistant(prose, [call, call])], protocol)[0].content
    parsed = parse_reply(text, protocol)
    assert [(c.name, c.arguments, c.parse_error) for c in parsed.calls] == [(name, arguments, None)] * 2
    assert json.dumps(parsed.calls[0].arguments) == json.dumps(arguments)  # key order kept
    assert render_call(parsed.calls[0], protocol) == render_call(call, protocol)
