"""Pieces shared by the tagged-JSON and ReAct text protocols: the parse result, lenient JSON
loading and call ids. No protocol knowledge lives here."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tether._errors import InvalidInput
from tether._types import Message, ToolCall, ToolSpec

IdMaker = Callable[[], str]


@dataclass(slots=True)
class ParsedReply:
    """What a text reply says: tool calls, a final answer, and the prose around them.

    `text` is the reply with the call blocks and the final answer taken out (a ReAct `Thought`,
    for instance). `errors` names blocks that looked like calls but could not be read at all
    (no tool name); calls with a name but broken arguments are in `calls` with `parse_error` set.
    """

    calls: list[ToolCall] = field(default_factory=list)
    final: str | None = None
    text: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def follows_protocol(self) -> bool:
        return bool(self.calls) or self.final is not None


def id_maker(used: Iterable[str] = (), start: int = 1) -> IdMaker:
    """Ids `call_<n>` counting from `start`, skipping any id in `used`."""
    taken = set(used)
    n = start - 1

    def make() -> str:
        nonlocal n
        n += 1
        while f"call_{n}" in taken:
            n += 1
        return f"call_{n}"

    return make


_DECODER = json.JSONDecoder()
_FENCE_OPEN = re.compile(r"\s*+```[A-Za-z0-9_+-]*+[ \t]*+\n?")
_NAME = re.compile(r"""["']name["']\s*+:\s*+["']([^"'\n]{1,200}+)["']""")
_ARGS = re.compile(r"""["'](?:arguments|parameters)["']\s*+:\s*+""")
_PY_WORDS = {"True": "true", "False": "false", "None": "null"}
_SINGLE_ESCAPES = {"'": "'", '"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "/": "/"}


def strip_fences(text: str) -> str:
    """Remove a Markdown code fence around `text` (the closing fence may be missing)."""
    m = _FENCE_OPEN.match(text)
    if m:
        text = text[m.end():].rstrip()
        if text.endswith("```"):
            text = text[:-3]
    return text.strip()


def decode_at(text: str, start: int) -> tuple[Any, int]:
    """Decode one JSON value starting at `start`; returns it and the index after it.

    Raises ValueError (also for nesting too deep for the decoder).
    """
    try:
        return _DECODER.raw_decode(text, start)
    except RecursionError as exc:
        raise InvalidInput("JSON nested too deeply") from exc


def repair_json(text: str) -> str:
    """Cheap repairs of near-JSON: single-quoted strings, Python True/False/None, trailing commas."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif c == "'":
            j, buf = i + 1, []
            while j < n and text[j] != "'":
                if text[j] == "\\" and j + 1 < n:
                    nxt = text[j + 1]
                    buf.append(_SINGLE_ESCAPES.get(nxt, "\\" + nxt))
                    j += 2
                else:
                    buf.append(text[j])
                    j += 1
            out.append(json.dumps("".join(buf), ensure_ascii=False))
            i = j + 1
        elif c == ",":
            j = i + 1
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j] in "}]":
                i = j  # drop the trailing comma
            else:
                out.append(c)
                i += 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append(_PY_WORDS.get(word, word))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def load_object(text: str) -> dict[str, Any]:
    """Read the first JSON object in `text`, leniently: code fences, text before or after the
    object, single quotes, Python literals and trailing commas are tolerated.

    Raises ValueError with a short reason when no object can be read.
    """
    text = strip_fences(text)
    start = text.find("{")
    if start < 0:
        raise InvalidInput("expected a JSON object")
    try:
        value, _ = decode_at(text, start)
    except ValueError as first:
        try:
            value, _ = decode_at(repair_json(text[start:]), 0)
        except ValueError:
            raise InvalidInput(f"not valid JSON ({first})") from None
    if not isinstance(value, dict):
        raise InvalidInput("expected a JSON object")
    return value


def find_name(text: str) -> str | None:
    """The `"name": "..."` of a call whose JSON is broken, if it can be seen."""
    m = _NAME.search(text)
    return (m.group(1).strip() or None) if m else None


def find_raw_arguments(text: str) -> str:
    """Best-effort arguments text of a broken call body: what follows `"arguments":`, less the
    brace closing the outer object; the whole body when there is no such key."""
    m = _ARGS.search(text)
    if not m:
        return text.strip()
    rest = text[m.end():].rstrip()
    return rest[:-1].rstrip() if rest.endswith("}") else rest


def single_string_param(tools: Iterable[ToolSpec] | None, name: str) -> str | None:
    """The parameter name when tool `name` takes exactly one parameter and it is a string."""
    for spec in tools or ():
        if spec.name != name:
            continue
        props = spec.parameters.get("properties") if isinstance(spec.parameters, dict) else None
        if isinstance(props, dict) and len(props) == 1:
            (key, schema), = props.items()
            if isinstance(schema, dict) and schema.get("type", "string") == "string":
                return str(key)
    return None


def arguments_text(call: ToolCall) -> str:
    """A call's arguments as the model wrote them: JSON, or the raw text when it did not parse."""
    if call.parse_error is not None:
        return call.raw_arguments if call.raw_arguments is not None else "{}"
    return json.dumps(call.arguments, ensure_ascii=False)


def render_turn(message: Message, final: Callable[[str], str], render_call: Callable[[ToolCall], str]) -> str:
    """An assistant message in a text protocol: the final answer, or its prose then its calls."""
    if not message.tool_calls:
        return final(message.content)
    parts = [message.content.strip()] if message.content.strip() else []
    parts.extend(render_call(c) for c in message.tool_calls)
    return "\n".join(parts)
