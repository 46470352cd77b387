"""The tool grammar enforces the whole schema: every reply it accepts validates.

Random schemas with enums, patterns, numeric ranges, string lengths and optional keys are turned
into grammars; random strings are drawn from each grammar (an independent sampler over the GBNF
text, tests/gbnf_tools.py) and must (1) validate against the schema with two validators (the
`jsonschema` library and tether's own), and (2) be accepted by llama.cpp's grammar engine, the
one that constrains decoding (when llama-cpp-python and the embedded GGUF are installed).
"""

from __future__ import annotations

import atexit
import json
import random
import re
from functools import cache
from typing import Any

import jsonschema
import pytest
from gbnf_tools import Gbnf
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from regex_oracle import nested_repeat
from regex_oracle import search as oracle_search

from tether._types import ToolSpec
from tether.models._gbnf import TOOL_CLOSE, GrammarError, GrammarLimits, Offered, format_call, reply_grammar
from tether.models._gbnf_numbers import integer_range
from tether.models._regex_gbnf import RegexError, pattern_body
from tether.tools._schema import JsonSchemaValidator
from tether.tools.builtin._calculator import EXPRESSION_PATTERN, calculator

PREFIX = '<tool_call>{"name":"t","arguments":'


@cache
def _llama() -> tuple[Any, Any] | None:
    try:
        import llama_cpp

        from tether.models._local import default_gguf_path
    except ImportError:
        return None
    path = default_gguf_path()
    if path is None:
        return None
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    atexit.register(llama.close)  # before interpreter teardown, when llama.cpp's bindings still exist
    return llama_cpp, llama


def llama_accepts(grammar: str, text: str) -> bool | None:
    """llama.cpp's verdict, or None when it is not installed or `text` has no tokenization (a character
    the tokenizer cannot round-trip, e.g. an unassigned code point: the model cannot write it either)."""
    found = _llama()
    if found is None:
        return None
    from tether.models._llama_grammar import accepts

    try:
        return accepts(found[0], found[1], grammar, text)
    except ValueError as exc:
        if "round-trip" in str(exc):
            return None
        raise


def arguments_of(reply: str) -> dict[str, Any]:
    assert reply.startswith(PREFIX) and reply.endswith("}" + TOOL_CLOSE), reply
    return json.loads(reply[len(PREFIX) : -len("}" + TOOL_CLOSE)])


# -- random regexes from the supported subset -----------------------------------------------------

_ATOMS = st.sampled_from(["a", "b", "z", "0", "7", "-", "_", " ", r"\.", r"\d", r"\w", r"\s", r"\D", ".",
                          "[a-c]", "[^a-z]", "[0-9a-f]", r"[\d.]", r"[^\s]", r'[\\"]', "é"])


def _quantify(draw: st.DrawFn, atom: str) -> str:
    q = draw(st.sampled_from(["", "", "?", "*", "+", "{2}", "{1,3}", "{0,2}", "{2,}"]))
    return atom + q


@st.composite
def regexes(draw: st.DrawFn, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        if depth < 2 and draw(st.integers(0, 4)) == 0:
            options = [draw(regexes(depth + 1)) for _ in range(draw(st.integers(1, 3)))]
            parts.append(_quantify(draw, "(" + "|".join(options) + ")"))
        else:
            parts.append(_quantify(draw, draw(_ATOMS)))
    body = "".join(parts)
    if depth == 0:
        body = ("^" if draw(st.booleans()) else "") + body + ("$" if draw(st.booleans()) else "")
    return body


# -- random schemas --------------------------------------------------------------------------------


def _bounded(draw: st.DrawFn, node: dict[str, Any], lo: float, hi: float) -> dict[str, Any]:
    """`node` with each of minimum/maximum plain, exclusive or absent."""
    for key, value in (("minimum", lo), ("maximum", hi)):
        choice = draw(st.sampled_from(["plain", "exclusive", "absent"]))
        if choice == "plain":
            node[key] = value
        elif choice == "exclusive":
            node["exclusiveM" + key[1:]] = value
    return node


@st.composite
def integer_schemas(draw: st.DrawFn) -> dict[str, Any]:
    lo = draw(st.integers(-2000, 2000))
    return _bounded(draw, {"type": "integer"}, lo, lo + draw(st.integers(0, 3000)))


@st.composite
def number_schemas(draw: st.DrawFn) -> dict[str, Any]:
    lo = draw(st.floats(-500, 500, allow_nan=False).map(lambda x: round(x, 2)))
    return _bounded(draw, {"type": "number"}, lo, lo + draw(st.floats(0.5, 800, allow_nan=False).map(lambda x: round(x, 2))))


@st.composite
def string_schemas(draw: st.DrawFn) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    if draw(st.booleans()):
        node["pattern"] = draw(regexes())
        if draw(st.booleans()):
            node["maxLength"] = draw(st.integers(3, 30))
    else:
        low = draw(st.integers(0, 5))
        node["minLength"] = low
        node["maxLength"] = low + draw(st.integers(0, 12))
    return node


ENUMS = st.lists(st.one_of(st.text(max_size=6), st.integers(-50, 50), st.booleans(), st.none()),
                 min_size=1, max_size=5, unique_by=lambda v: json.dumps(v)).map(lambda vs: {"enum": vs})
VALUE_SCHEMAS = st.one_of(
    ENUMS, integer_schemas(), number_schemas(), string_schemas(), st.just({"type": "boolean"}),
    integer_schemas().map(lambda s: {"type": "array", "items": s, "maxItems": 3}),
)


@st.composite
def object_schemas(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, max_size=4, unique=True))
    props = {n: draw(VALUE_SCHEMAS) for n in names}
    required = [n for n in names if draw(st.booleans())]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


STRICT = GrammarLimits(strict=True, max_string_chars=40, max_pattern_repeat=4)


def _check_samples(schema: dict[str, Any], grammar: str, seed: int, count: int = 8) -> None:
    g = Gbnf(grammar)
    rng = random.Random(seed)
    validator = jsonschema.Draft202012Validator(schema)
    ours = JsonSchemaValidator(schema)
    for _ in range(count):
        reply = g.sample(rng)
        if not reply.startswith("<tool_call>"):
            continue
        args = arguments_of(reply)
        errors = [e.message for e in validator.iter_errors(args)]
        assert not errors, f"grammar produced {reply!r}, invalid for {schema}: {errors}"
        ours.validate(args)
        assert g.matches(reply)
        verdict = llama_accepts(grammar, reply)
        assert verdict in (True, None), f"llama.cpp refused {reply!r} from its own grammar"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(object_schemas(), st.integers(0, 2**32))
def test_every_reply_the_grammar_accepts_validates(schema: dict[str, Any], seed: int) -> None:
    try:
        grammar = reply_grammar([ToolSpec("t", "", schema)], STRICT, allow_final=False)
    except GrammarError:
        assume(False)  # e.g. a pattern whose matches cannot fit maxLength, or bounds no number meets
        return
    _check_samples(schema, grammar, seed)


@settings(max_examples=150, deadline=None)
@given(regexes(), st.integers(0, 2**32))
def test_pattern_translation_is_sound(pattern: str, seed: int) -> None:
    """Every string the translated grammar allows matches the regex. Judged by `regex_oracle.search`
    (Python's regex semantics without backtracking: `re.search` can take hours on a nested repeat such
    as `((a|b?)+c?){2,}$`), and by `re.search` too wherever no repeat is nested in another."""
    try:
        body = pattern_body(pattern, cap=4)
    except RegexError:
        assume(False)
        return
    g = Gbnf(f'root ::= "\\"" {body} "\\""')
    rng = random.Random(seed)
    backtracking_is_safe = not nested_repeat(pattern)
    for _ in range(10):
        text = json.loads(g.sample(rng))
        assert oracle_search(pattern, text), f"{text!r} does not match {pattern!r}"
        if backtracking_is_safe:
            assert re.search(pattern, text), f"{text!r} does not match {pattern!r}"


# (pattern, text, whether re.search finds a match): Python's corners, and a pattern that backtracks for
# hours on a text it does match
ORACLE_CASES = [
    (r"^a$", "a\n", True), (r"^a\Z", "a\n", False), (r"a$", "a\nb", False), (r"^b", "ab", False),
    (r"b", "ab", True), (r"\A$", "", True), (r".", "\n", False), (r"[^a-z]", "é", True), (r"\w", "é", True),
    (r"\d", "٣", True), (r"\D\s", "a\u00a0", True), (r"[\d.]{2}", "1.", True), (r"[^\s]", " \t", False),
    (r"(a|b?){3,}c", "c", True), (r"(ab){2}", "abab", True), (r"(ab){2}", "abaab", False),
    (r"x{2,}?y", "xxy", True), (r"x{2,}y", "xy", False), (r'[\\"]+', '\\"', True), (r"(a*)*$", "b", True),
    (r"^((a|b?)+c?){2,}d$", "ab" * 12 + "e", False),
]


@pytest.mark.parametrize(("pattern", "text", "found"), ORACLE_CASES)
def test_the_regex_oracle_agrees_with_re(pattern: str, text: str, found: bool) -> None:
    assert oracle_search(pattern, text) is found
    if not nested_repeat(pattern):
        assert (re.search(pattern, text) is not None) is found


@settings(max_examples=200, deadline=None)
@given(st.integers(-3000, 3000), st.integers(0, 3000))
def test_integer_ranges_are_exact(lo: int, width: int) -> None:
    hi = lo + width
    g = Gbnf(f"root ::= {integer_range(lo, hi)}")
    for n in {lo - 1, lo, lo + 1, (lo + hi) // 2, hi - 1, hi, hi + 1, 0, -1, 10 * hi + 7}:
        assert g.matches(str(n)) == (lo <= n <= hi), (lo, hi, n)
    if hi > 0:
        assert not g.matches("0" + str(hi))  # no leading zeros


def test_llama_cpp_agrees_on_ranges_and_patterns() -> None:
    if _llama() is None:
        pytest.skip("llama-cpp-python and the embedded GGUF are not installed")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 120},
                                               "code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"}},
              "required": ["n", "code"]}
    grammar = reply_grammar([ToolSpec("t", "", schema)], STRICT, allow_final=False)
    good = format_call("t", {"n": 120, "code": "AB-123"})
    assert llama_accepts(grammar, good) is True
    for bad in ({"n": 121, "code": "AB-123"}, {"n": 4, "code": "AB-123"}, {"n": 50, "code": "ab-123"},
                {"n": 50, "code": "AB-1234"}, {"n": 50}):
        assert llama_accepts(grammar, format_call("t", bad)) is False, bad


def test_the_calculator_grammar_refuses_a_trailing_comma() -> None:
    grammar = reply_grammar([calculator.spec])
    g = Gbnf(grammar)
    for ok in ("17*23", "17 * 23", "(2 + 3) * sqrt(16) / 7", "max(1, 2, 3)", "2 ** 10", "-3.5e2+pi"):
        assert re.search(EXPRESSION_PATTERN, ok)
        assert g.matches(format_call("calculator", {"expression": ok})), ok
    for bad in ("17*23,", "17*", "", "x + 1", "17 23"):
        assert not g.matches(format_call("calculator", {"expression": bad})), bad
        assert llama_accepts(grammar, format_call("calculator", {"expression": bad})) in (False, None), bad
    assert llama_accepts(grammar, format_call("calculator", {"expression": "17 * 23"})) in (True, None)


def test_declared_values_are_the_only_choices() -> None:
    schema = {"type": "object", "properties": {
        "path": {"type": "string", "maxLength": 12, "x-tether-values": {"from": "files"}},
        "q": {"type": "string", "minLength": 1, "x-tether-values": {"from": "request"}}},
        "required": ["path", "q"]}

    def resolve(source: dict[str, Any]) -> Offered:
        if source["from"] == "files":
            return Offered(values=("a.txt", "notes/b.txt", "much/too/long/a/path.txt"))
        return Offered(words=("express", "shipping", "cost"))

    g = Gbnf(reply_grammar([ToolSpec("t", "", schema)], values=resolve))
    assert g.matches(format_call("t", {"path": "notes/b.txt", "q": "express shipping"}))
    assert g.matches(format_call("t", {"path": "a.txt", "q": "cost"}))
    assert not g.matches(format_call("t", {"path": "alice.txt", "q": "cost"}))  # invented path
    assert not g.matches(format_call("t", {"path": "much/too/long/a/path.txt", "q": "cost"}))  # over maxLength
    assert not g.matches(format_call("t", {"path": "a.txt", "q": "london-london"}))  # invented words
    # nothing resolved: the schema alone applies
    g = Gbnf(reply_grammar([ToolSpec("t", "", schema)], values=lambda source: None))
    assert g.matches(format_call("t", {"path": "alice.txt", "q": "anything"}))


def test_final_answer_quotes_only_result_text() -> None:
    g = Gbnf(reply_grammar([calculator.spec], quotes=[["391"], ["Lyon has 522,000 inhabitants.", "Lyon."]]))
    assert not g.matches("<final>391</final>")  # one text of each result
    assert g.matches("<final>391 Lyon has 522,000 inhabitants.</final>")
    assert not g.matches("<final>Today it is 18 C and sunny in Paris.</final>")
    assert not g.matches("<final>17 * 23 = 34</final>")
