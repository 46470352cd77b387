"""GBNF grammars that force a tiny model's reply into tether's tagged tool-call format.

`reply_grammar(tools)` is exactly one of

    <tool_call>{"name":"NAME","arguments":{...}}</tool_call>
    <final>TEXT</final>

where NAME is one of the tool names and the arguments follow that tool's JSON Schema, so every
call the grammar allows validates: objects carry their required keys (optional ones may be left
out, unknown ones cannot appear), strings keep their minLength/maxLength (under a cap) and their
`pattern` (translated by `_regex_gbnf`, the subset tools use), integers and numbers stay within
minimum/maximum (`_gbnf_numbers`), enums and consts are their literal values. A string parameter
may also declare where its values come from (`VALUES_KEY`, see `tether.tools._base.values_from`):
the caller resolves that to a list (the workspace's files, words of the request) and the
grammar offers exactly those. `final_quotes` limits the final answer to text copied from the
tool results.

The JSON layout is fixed and compact (`{"key":value,"key2":value}`, `format_call` writes it), which
keeps tiny models from wandering off into whitespace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tether._errors import TetherError
from tether._types import ToolSpec
from tether.models._gbnf_numbers import bounds, has_bounds, integer_range, number_range
from tether.models._regex_gbnf import RegexError, literal, pattern_body
from tether.tools._base import VALUES_KEY


@dataclass(frozen=True, slots=True)
class Offered:
    """What a value source resolved to: exactly one of `values`, or a sequence of `words`."""

    values: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    max_words: int = 8
    exhausted: bool = False  # the source has nothing (left) to offer: the tool is not offered at all
    pending: bool = False  # the request still needs one of these (a file it names is unread): no answer yet


class _NothingToOffer(Exception):
    """A parameter's value source is exhausted, so its tool cannot be called now."""


# Resolves a value-source declaration to what to offer (None: anything the schema allows).
ValueResolver = Callable[[dict[str, Any]], "Offered | None"]

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
FINAL_OPEN, FINAL_CLOSE = "<final>", "</final>"


class GrammarError(TetherError, ValueError):
    """The tool schemas cannot be turned into a grammar (e.g. duplicate or empty tool names)."""


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """Caps that keep a tiny model from running away inside a value."""

    max_string_chars: int = 200
    max_final_chars: int = 1000
    max_array_items: int = 8
    max_integer_digits: int = 15
    max_fraction_digits: int = 8
    # Characters string values may not contain. Tiny models forget the closing quote and run on
    # with `}}`; excluding `}` turns that into a closed string (see LocalModel).
    string_excludes: str = ""
    # False: objects carry only their required keys. Tiny models fill every optional key they
    # see (offset=1, limit=1 on a file read) and then misread the partial result.
    optional_keys: bool = True
    # Unbounded quantifiers in a `pattern` repeat at most this many times.
    max_pattern_repeat: int = 12
    # True: a schema the grammar cannot enforce exactly raises GrammarError; False: that part is
    # left to the tool's validator (its error tells the model what to change).
    strict: bool = False


def json_literal(value: Any) -> str:
    """A GBNF literal matching `value` as ASCII JSON in the grammar's compact layout."""
    return literal(json.dumps(value, ensure_ascii=True, separators=(ITEM_SEP, KEY_SEP)))


# Compact layout. Measured with SmolLM2-135M: with `": "` the model often samples a lone space
# token and then `"}` (an opening quote plus a brace), i.e. an empty or runaway string; the
# compact layout has no such split and produced the intended arguments.
ITEM_SEP, KEY_SEP = ",", ":"
_C = literal(ITEM_SEP)
_K = literal(KEY_SEP)
_CALL_OPEN = literal(TOOL_OPEN + '{"name"' + KEY_SEP)
_ARGS_KEY = literal(ITEM_SEP + '"arguments"' + KEY_SEP)
_CALL_CLOSE = literal("}" + TOOL_CLOSE)


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in exactly the layout the grammar forces (for prompts and examples)."""
    args = json.dumps(arguments, ensure_ascii=False, separators=(ITEM_SEP, KEY_SEP))
    return f"{TOOL_OPEN}{{\"name\"{KEY_SEP}{json.dumps(name, ensure_ascii=False)}{ITEM_SEP}\"arguments\"{KEY_SEP}{args}}}{TOOL_CLOSE}"


def _class_char(ch: str) -> str:
    """`ch` written for use inside a GBNF character class."""
    if ch in "\\]^-[":
        return "\\" + ch
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{ord(ch):02X}"
    return ch


def _rule_name(text: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()
    return name or "x"


def _repeat(item: str, low: int, high: int) -> str:
    """`item` repeated low..high times, written as nested optionals (no `{m,n}` needed)."""
    if high < low:
        raise GrammarError(f"empty range {low}..{high}")
    if high == 0:
        return '""'
    # llama.cpp understands {m,n} natively since 2024; it expands it to the same nested rules.
    if low == high:
        return f"{item}{{{low}}}"
    return f"{item}{{{low},{high}}}"


@dataclass
class _Builder:
    limits: GrammarLimits
    values: ValueResolver | None = None
    pending: bool = False  # some offered values are still needed before an answer
    defs: dict[str, Any] = field(default_factory=dict)
    rules: dict[str, str] = field(default_factory=dict)
    _by_body: dict[str, str] = field(default_factory=dict)

    def add(self, hint: str, body: str) -> str:
        """Add a rule (reusing an identical one) and return its name."""
        if body in self._by_body:
            return self._by_body[body]
        base = _rule_name(hint)
        name, n = base, 1
        while name in self.rules:
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = body
        self._by_body[body] = name
        return name

    # primitives ---------------------------------------------------------------------------
    def string(self, low: int = 0, high: int | None = None) -> str:
        cap = self.limits.max_string_chars if high is None else min(high, self.limits.max_string_chars)
        low = min(low, cap)
        excluded = "".join(_class_char(c) for c in dict.fromkeys(self.limits.string_excludes))
        char = self.add("char", rf'[^"\\\x7F\x00-\x1F{excluded}] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{{4}})')
        return self.add(f"string-{low}-{cap}" if (low, cap) != (0, self.limits.max_string_chars) else "string",
                        f'"\\"" {_repeat(char, low, cap)} "\\""')

    def integer(self) -> str:
        d = self.limits.max_integer_digits
        return self.add("integer", f'"-"? ("0" | [1-9] {_repeat("[0-9]", 0, d - 1)})')

    def number(self) -> str:
        f = self.limits.max_fraction_digits
        return self.add(
            "number", f'{self.integer()} ("." {_repeat("[0-9]", 1, f)})? ([eE] [-+]? {_repeat("[0-9]", 1, 3)})?'
        )

    def boolean(self) -> str:
        return self.add("boolean", '"true" | "false"')

    def null(self) -> str:
        return self.add("null", '"null"')

    def any_value(self) -> str:
        """Any JSON value (used where a schema says nothing about the type)."""
        if "value" in self.rules:
            return "value"
        self.rules["value"] = ""  # reserve the name: the rule is recursive
        obj = self.add("any-object", f'"{{}}" | "{{" {self.string()} {_K} value ({_C} {self.string()} {_K} value)* "}}"')
        arr = self.add("any-array", f'"[]" | "[" value ({_C} value)* "]"')
        body = f"{obj} | {arr} | {self.string()} | {self.number()} | {self.boolean()} | {self.null()}"
        self.rules["value"] = body
        self._by_body[body] = "value"
        return "value"

    # schemas ------------------------------------------------------------------------------
    def schema(self, node: Any, hint: str, seen: tuple[str, ...] = ()) -> str:
        if node is True or node == {} or node is None:
            return self.any_value()
        if node is False:
            raise GrammarError(f"{hint}: schema `false` accepts nothing")
        if not isinstance(node, dict):
            raise GrammarError(f"{hint}: a schema must be an object, got {type(node).__name__}")
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if not ref.startswith(("#/$defs/", "#/definitions/")) or name not in self.defs:
                raise GrammarError(f"{hint}: unsupported $ref {ref!r}")
            if name in seen:  # recursive schema: accept any JSON below this point
                return self.any_value()
            return self.schema(self.defs[name], name, (*seen, name))
        if "const" in node:
            return self.add(f"{hint}-const", json_literal(node["const"]))
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values:
                raise GrammarError(f"{hint}: enum must be a non-empty list")
            return self.add(f"{hint}-enum", " | ".join(json_literal(v) for v in values))
        for key in ("anyOf", "oneOf"):
            if key in node:
                options = node[key]
                if not isinstance(options, list) or not options:
                    raise GrammarError(f"{hint}: {key} must be a non-empty list")
                parts = [self.schema(o, f"{hint}-{i}", seen) for i, o in enumerate(options)]
                return self.add(f"{hint}-alt", " | ".join(dict.fromkeys(parts)))
        if "allOf" in node and isinstance(node["allOf"], list) and len(node["allOf"]) == 1:
            return self.schema(node["allOf"][0], hint, seen)
        kind = node.get("type")
        if isinstance(kind, list):
            parts = [self.schema({**node, "type": k}, f"{hint}-{k}", seen) for k in kind]
            return self.add(f"{hint}-alt", " | ".join(dict.fromkeys(parts)))
        if kind is None:
            if "properties" in node:
                kind = "object"
            elif "items" in node:
                kind = "array"
            else:
                return self.any_value()
        if kind == "string":
            return self.string_node(node, hint)
        if kind == "integer":
            if has_bounds(node):
                lo, hi = bounds(node, integer=True, digits=self.limits.max_integer_digits)
                if lo > hi:
                    raise GrammarError(f"{hint}: no integer satisfies the bounds")
                return self.add(f"{hint}-int", integer_range(int(lo), int(hi)))
            return self.integer()
        if kind == "number":
            if has_bounds(node):
                body = number_range(node, digits=self.limits.max_integer_digits,
                                    fraction_digits=self.limits.max_fraction_digits)
                if body is None:
                    raise GrammarError(f"{hint}: no number satisfies the bounds")
                return self.add(f"{hint}-num", body)
            return self.number()
        if kind == "boolean":
            return self.boolean()
        if kind == "null":
            return self.null()
        if kind == "array":
            return self.array(node, hint, seen)
        if kind == "object":
            return self.object(node, hint, seen)
        raise GrammarError(f"{hint}: unsupported type {kind!r}")

    def string_node(self, node: dict[str, Any], hint: str) -> str:
        """A string schema: declared values, else pattern and lengths."""
        low = int(node.get("minLength", 0))
        high = node.get("maxLength")
        offered = self.offered(node, hint)
        if offered:
            return offered
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            # Only a declared maxLength lowers the quantifier caps (the reply's token cap bounds
            # the rest): the 200-character default would cut an expression's numbers to 7 digits.
            cap = None if high is None else int(high)
            excludes = tuple((ord(c), ord(c)) for c in self.limits.string_excludes)
            try:
                body = pattern_body(pattern, min_len=low, max_len=cap,
                                    cap=self.limits.max_pattern_repeat, excludes=excludes)
            except RegexError as exc:
                if self.limits.strict:
                    raise GrammarError(f"{hint}: {exc}") from None
            else:
                return self.add(f"{hint}-pattern", f'"\\"" {body} "\\""')
        return self.string(low, high)

    def offered(self, node: dict[str, Any], hint: str) -> str | None:
        """A rule for the values a declared source (VALUES_KEY) yields that fit the rest of the
        string schema, or None (no source, nothing resolved, or nothing fits)."""
        source = node.get(VALUES_KEY)
        if self.values is None or not isinstance(source, dict):
            return None
        found = self.values(source)
        if found is None:
            return None
        if found.exhausted:
            raise _NothingToOffer
        self.pending = self.pending or found.pending
        low, high = int(node.get("minLength", 0)), node.get("maxLength")
        high = self.limits.max_string_chars if high is None else min(int(high), self.limits.max_string_chars)
        pattern = node.get("pattern")
        if found.values:
            fits = [v for v in dict.fromkeys(found.values) if _fits(v, low, high, pattern)]
            return self.add(f"{hint}-values", " | ".join(json_literal(v) for v in fits)) if fits else None
        words = [w for w in dict.fromkeys(found.words) if w and _fits(w, 0, high, None) and " " not in w]
        if not words or pattern is not None:
            return None
        longest = max(len(w) for w in words)
        count = max(1, min(found.max_words, (high + 1) // (longest + 1)))
        if low > min(len(w) for w in words):
            return None  # one word must already reach minLength
        word = self.add(f"{hint}-word", " | ".join(literal(json.dumps(w)[1:-1]) for w in words))
        return self.add(f"{hint}-words", f'"\\"" {word} (" " {word}){{0,{count - 1}}} "\\""')

    def array(self, node: dict[str, Any], hint: str, seen: tuple[str, ...]) -> str:
        item = self.schema(node.get("items", {}), f"{hint}-item", seen)
        low = int(node.get("minItems", 0))
        high = min(int(node.get("maxItems", self.limits.max_array_items)), self.limits.max_array_items)
        low = min(low, high)
        if high == 0:
            return self.add(f"{hint}-array", '"[]"')
        more = _repeat(f"({_C} {item})", max(low - 1, 0), high - 1)
        body = f'"[" {item} {more} "]"'
        if low == 0:
            body = f'"[]" | {body}'
        return self.add(f"{hint}-array", body)

    def object(self, node: dict[str, Any], hint: str, seen: tuple[str, ...]) -> str:
        props: dict[str, Any] = node.get("properties") or {}
        required = [k for k in node.get("required", []) if isinstance(k, str)]
        if not props and not required:
            # Declared properties (even none) close the object: a tool's arguments are its named
            # parameters. Only a schema with no `properties` at all is a free-form map.
            extra = node.get("additionalProperties", "properties" not in node)
            if extra is False:
                return self.add("empty-object", '"{}"')
            value = self.any_value() if extra in (True, None) else self.schema(extra, f"{hint}-value", seen)
            s = self.string()
            return self.add(f"{hint}-map", f'"{{}}" | "{{" {s} {_K} {value} ({_C} {s} {_K} {value})* "}}"')
        # Required keys first (in declaration order), then the optional ones: a fixed order keeps
        # the grammar linear in the number of keys while any subset of optional keys stays possible.
        keys = [k for k in props if k in required] + [k for k in required if k not in props]
        if self.limits.optional_keys or not keys:
            keys += [k for k in props if k not in required]
        pairs = []
        for key in keys:
            value = self.schema(props.get(key, {}), f"{hint}-{key}", seen)
            pairs.append((key, key in required, f"{json_literal(key)} {_K} {value}"))
        # first(i): the pairs from i on when nothing has been written yet (no leading comma).
        # Only first(0 .. first required key) is reachable; required keys come first, so with any
        # required key that is just first(0).
        last = next((i for i, (_, req, _) in enumerate(pairs) if req), len(pairs) - 1)
        first_rule: str = '""'
        for i in range(last, -1, -1):
            key, is_required, kv = pairs[i]
            rest = " ".join(f"{_C} {p}" if req else f"({_C} {p})?" for _, req, p in pairs[i + 1 :])
            seq = f"{kv} {rest}".strip()
            body = seq if is_required else f"{seq} | {first_rule}" if first_rule != '""' else f"({seq})?"
            first_rule = self.add(f"{hint}-from-{key}", body)
        return self.add(f"{hint}-object", f'"{{" {first_rule} "}}"')

    def render(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items()]
        return "\n".join(lines) + "\n"


def _fits(value: str, low: int, high: int, pattern: Any) -> bool:
    if not low <= len(value) <= high:
        return False
    if not isinstance(pattern, str):
        return True
    try:
        return re.search(pattern, value) is not None
    except re.error:
        return False


def arguments_rule(builder: _Builder, spec: ToolSpec) -> str:
    """The rule for one tool's `arguments` object."""
    params = dict(spec.parameters or {})
    builder.defs = {**params.get("definitions", {}), **params.get("$defs", {})}
    params.setdefault("type", "object")
    if params.get("type") != "object":
        raise GrammarError(f"tool {spec.name!r}: arguments schema must be an object, got {params.get('type')!r}")
    return builder.schema(params, f"args-{spec.name}")


def reply_grammar(
    tools: Sequence[ToolSpec],
    limits: GrammarLimits | None = None,
    *,
    allow_final: bool = True,
    values: ValueResolver | None = None,
    quotes: Sequence[Sequence[str]] | None = None,
) -> str:
    """GBNF text for a reply that is exactly one tool call (to one of `tools`) or a final answer.

    `values` resolves value-source declarations (VALUES_KEY) to the values to offer; `quotes`
    (groups of texts, one per tool result), when given, makes the final answer one text of each
    group, copied verbatim (see `final_rule`).
    """
    builder = _Builder(limits or GrammarLimits(), values)
    names = [t.name for t in tools]
    if any(not n for n in names):
        raise GrammarError("a tool has an empty name")
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise GrammarError(f"duplicate tool names: {', '.join(dupes)}")
    calls = []
    for spec in tools:
        try:
            args = arguments_rule(builder, spec)
        except _NothingToOffer:
            continue
        calls.append(builder.add(f"call-{spec.name}", f"{json_literal(spec.name)} {_ARGS_KEY} {args}"))
    if calls and builder.pending:
        allow_final = False  # e.g. the request names a file not read yet
    alternatives = []
    if calls:
        call = builder.add("call", " | ".join(calls))
        alternatives.append(f"{_CALL_OPEN} {call} {_CALL_CLOSE}")
    if allow_final or not calls:
        alternatives.append(final_rule(builder, quotes))
    return builder.render(" | ".join(alternatives))


def final_rule(builder: _Builder, quotes: Sequence[Sequence[str]] | None = None) -> str:
    """`<final>TEXT</final>`; with `quotes` (one group of texts per tool result), TEXT is one text
    of each group, copied verbatim, joined by spaces: the answer quotes every result it got."""
    groups = [[q for q in dict.fromkeys(g) if q.strip() and FINAL_CLOSE not in q] for g in quotes or ()]
    groups = [g for g in groups if g]
    if groups:
        parts = [builder.add("quote", " | ".join(literal(q) for q in g)) for g in groups]
        text = builder.add("final-text", ' " " '.join(parts))
    else:
        text = builder.add("final-text", _repeat("[^<]", 1, builder.limits.max_final_chars))
    return builder.add("final", f"{literal(FINAL_OPEN)} {text} {literal(FINAL_CLOSE)}")


def final_grammar(limits: GrammarLimits | None = None, quotes: Sequence[Sequence[str]] | None = None) -> str:
    """GBNF text for a final answer only (`<final>TEXT</final>`, quoting `quotes` when given)."""
    return reply_grammar([], limits, allow_final=True, quotes=quotes)
