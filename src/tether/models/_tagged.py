"""The tagged-JSON text protocol: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
for calls, `<final>...</final>` for the answer, `<tool_result ...>` user messages for results.

The call layout is the `json.dumps` default, the same one the GBNF grammars in `_gbnf` force.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from typing import Any

from tether._types import Message, ToolCall, ToolSpec
from tether.models._text_common import (
    IdMaker,
    ParsedReply,
    arguments_text,
    decode_at,
    find_name,
    find_raw_arguments,
    id_maker,
    load_object,
    render_turn,
    single_string_param,
    strip_fences,
)

_OPEN = re.compile(r"<\s*tool_call\s*>", re.I)
_CLOSE = re.compile(r"<\s*/\s*tool_call\s*>", re.I)
# where a call body ends: its closing tag, the next call, the final answer, or the end of text
_BODY_END = re.compile(r"<\s*/\s*tool_call\s*>|<\s*tool_call\s*>|<\s*final\s*>|\Z", re.I)
_FINAL = re.compile(r"<\s*final\s*>(.*?)(?:<\s*/\s*final\s*>|\Z)", re.I | re.S)
_RESULT = re.compile(r"<\s*tool_result\b", re.I)
_FENCE_AT = re.compile(r"\s*+(?:```[A-Za-z0-9_+-]*+[ \t]*+\n?)?\s*+")

STOP = "<tool_result"  # a model that invents its own tool results is cut off here
MAX_BLOCKS = 100  # bounds the work on a runaway reply (each block may decode to the end of the text)


def render_call(call: ToolCall) -> str:
    """One call in the exact form the model is asked to write."""
    args = arguments_text(call)
    return f'<tool_call>{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": {args}}}</tool_call>'


def render_assistant(message: Message) -> str:
    return render_turn(message, lambda text: f"<final>{text}</final>", render_call)


def render_result(name: str, call_id: str, content: str) -> str:
    return (f'<tool_result name="{html.escape(name)}" id="{html.escape(call_id)}">\n'
            f"{content}\n</tool_result>")


def _call_from_object(obj: dict[str, Any], make_id: IdMaker,
                      tools: Sequence[ToolSpec] | None) -> ToolCall | str:
    """A ToolCall from a decoded block, or an error string when there is no tool name."""
    if isinstance(obj.get("function"), dict):  # OpenAI-style {"function": {"name", "arguments"}}
        obj = obj["function"]
    name = obj.get("name", obj.get("tool"))
    if not isinstance(name, str) or not name.strip():
        return 'a <tool_call> block needs a "name" string'
    name = name.strip()
    args: Any = {}
    for key in ("arguments", "parameters", "args", "input"):
        if key in obj:
            args = obj[key]
            break
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = load_object(args) if args.strip() else {}
        except ValueError as exc:
            param = single_string_param(tools, name)
            if param is not None:
                return ToolCall(make_id(), name, {param: args})
            return ToolCall(make_id(), name, parse_error=f"arguments: {exc}", raw_arguments=json.dumps(args))
    if not isinstance(args, dict):
        return ToolCall(make_id(), name, parse_error="arguments must be a JSON object",
                        raw_arguments=json.dumps(args, ensure_ascii=False))
    return ToolCall(make_id(), name, args)


def _read_call(text: str, start: int, make_id: IdMaker,
               tools: Sequence[ToolSpec] | None) -> tuple[ToolCall | str, int]:
    """Read the call body starting at `start` (just after `<tool_call>`); returns the call (or an
    error string) and the index where scanning resumes."""
    i = _FENCE_AT.match(text, start).end()  # type: ignore[union-attr]  # the pattern matches ""
    if i < len(text) and text[i] == "{":
        try:
            obj, j = decode_at(text, i)
        except ValueError:
            pass
        else:
            # a JSON string may contain "</tool_call>", so the end is searched after the object
            end = _BODY_END.search(text, j)
            assert end is not None  # \Z always matches
            resume = end.end() if _CLOSE.fullmatch(end.group()) else j
            return _call_from_object(obj, make_id, tools), resume
    end = _BODY_END.search(text, start)
    assert end is not None
    resume = end.end() if _CLOSE.fullmatch(end.group()) else end.start()
    body = strip_fences(text[start:end.start()])
    try:
        obj = load_object(body)
    except ValueError as exc:
        name = find_name(body)
        if name is None:
            return f"could not read the <tool_call> block ({exc})", resume
        return ToolCall(make_id(), name, parse_error=str(exc), raw_arguments=find_raw_arguments(body)), resume
    return _call_from_object(obj, make_id, tools), resume


def parse_tagged(text: str, *, make_id: IdMaker | None = None,
                 tools: Sequence[ToolSpec] | None = None) -> ParsedReply:
    """Parse a tagged-JSON reply. Never raises.

    Tolerated: code fences inside or instead of the tags, text around the blocks, a missing
    closing tag, `arguments` given as a JSON string, single quotes, trailing commas. Calls win
    over a `<final>` in the same reply (the model answered before seeing the results). With
    `tools`, a non-JSON `arguments` string for a tool taking one string parameter becomes that
    parameter. A reply with no tags that is exactly a `{"name": ..., "arguments": ...}` object
    counts as one call.
    """
    make_id = make_id or id_maker()
    calls: list[ToolCall] = []
    errors: list[str] = []
    prose: list[str] = []
    pos = 0
    result = _RESULT.search(text)  # the next <tool_result; searched again only once passed (linear)
    while (m := _OPEN.search(text, pos)) is not None:
        prose.append(text[pos:m.start()])
        if len(calls) + len(errors) >= MAX_BLOCKS:
            errors.append(f"more than {MAX_BLOCKS} <tool_call> blocks; the rest were ignored")
            pos = len(text)
            break
        call, pos = _read_call(text, m.end(), make_id, tools)
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
        if result is not None and result.start() < pos:
            result = _RESULT.search(text, pos)
        if result is not None:
            # a result after a call, before any further call, was invented by the model: drop the rest
            after = _OPEN.search(text, pos, result.start())
            if after is None:
                text = text[:result.start()]
                result = None
    prose.append(text[pos:])
    rest = "".join(prose)
    final = None
    fm = _FINAL.search(rest)
    if fm:
        final = fm.group(1).strip()
        rest = rest[:fm.start()] + rest[fm.end():]
    if not calls and final is None and not errors:
        bare = _bare_call(rest, make_id, tools)
        if bare is not None:
            return ParsedReply([bare], None, "", [])
    return ParsedReply(calls, final, rest.strip(), errors)


def _bare_call(text: str, make_id: IdMaker, tools: Sequence[ToolSpec] | None) -> ToolCall | None:
    body = strip_fences(text)
    if not body.startswith("{"):
        return None
    try:
        obj, end = decode_at(body, 0)
    except ValueError:
        return None
    if (not isinstance(obj, dict) or body[end:].strip() or not isinstance(obj.get("name"), str)
            or not ({"arguments", "parameters"} & obj.keys())):
        return None
    call = _call_from_object(obj, make_id, tools)
    return call if isinstance(call, ToolCall) else None
