"""The ReAct text protocol: `Thought:` / `Action: tool` / `Action Input: {json}` for calls (several
Action blocks per reply allowed), `Observation:` user messages for results, `Final Answer:` to end.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tether._types import Message, ToolCall, ToolSpec
from tether.models._text_common import (
    IdMaker,
    ParsedReply,
    arguments_text,
    id_maker,
    load_object,
    render_turn,
    single_string_param,
    strip_fences,
)

# A header at the start of a line, tolerating Markdown emphasis (`**Action:**`) and numbering.
_HEADER = re.compile(
    r"^[ \t]*+(?:[*_#>]++[ \t]*+)?(thought|action[ \t_]*+input|action|observation|final[ \t_]*+answer)"
    r"[ \t]*+(?:\d++[ \t]*+)?(?:[*_]++[ \t]*+)?:[*_]*+[ \t]*+",
    re.I | re.M,
)
_NAME = re.compile(r"[`'\"*\[]*+([^\s`'\"*(\[{\]]++)[`'\"*\]]*+")

STOP = "\nObservation"  # a model that invents its own observations is cut off here


def render_call(call: ToolCall) -> str:
    args = arguments_text(call)
    return f"Action: {call.name}\nAction Input: {args}"


def render_assistant(message: Message) -> str:
    return render_turn(message, lambda text: f"Final Answer: {text}", render_call)


def render_result(name: str, call_id: str, content: str) -> str:
    return f"Observation: {content}"


def _kind(header: str) -> str:
    return re.sub(r"[\s_]", "", header.lower())


def _make_call(name: str, raw: str, make_id: IdMaker, tools: Sequence[ToolSpec] | None) -> ToolCall:
    call_id, raw = make_id(), raw.strip()
    if not raw:
        return ToolCall(call_id, name, {})
    try:
        return ToolCall(call_id, name, load_object(raw))
    except ValueError as exc:
        param = single_string_param(tools, name)
        if param is not None:
            value = strip_fences(raw)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            return ToolCall(call_id, name, {param: value})
        return ToolCall(call_id, name, parse_error=f"Action Input: {exc}", raw_arguments=raw)


def parse_react(text: str, *, make_id: IdMaker | None = None,
                tools: Sequence[ToolSpec] | None = None) -> ParsedReply:
    """Parse a ReAct reply. Never raises.

    Headers are matched at line starts, case-insensitively, with Markdown emphasis tolerated.
    Everything after an `Observation:` that follows an Action is dropped (the model invented
    it). An Action without `Action Input` takes the text after the tool name, or no arguments.
    With `tools`, a non-JSON input for a tool taking one string parameter becomes that parameter.
    Calls win over a `Final Answer` in the same reply. `text` is what precedes the first Action
    or the Final Answer (usually the Thought).
    """
    make_id = make_id or id_maker()
    calls: list[ToolCall] = []
    errors: list[str] = []
    final: str | None = None
    prose_end: int | None = None
    pending: tuple[str, str] | None = None  # (tool name, text after it) awaiting an Action Input
    headers = list(_HEADER.finditer(text))
    for k, h in enumerate(headers):
        kind = _kind(h.group(1))
        seg_end = headers[k + 1].start() if k + 1 < len(headers) else len(text)
        segment = text[h.end():seg_end]
        if kind == "observation":
            if pending is not None or calls:
                break
            continue
        if kind == "action":
            if prose_end is None:
                prose_end = h.start()
            if pending is not None:
                calls.append(_make_call(*pending, make_id, tools))
                pending = None
            body = segment.lstrip()
            m = _NAME.match(body)
            if m is None or not m.group(1).rstrip(".:,;"):
                errors.append("an Action needs a tool name")
                continue
            pending = (m.group(1).rstrip(".:,;"), body[m.end():])
        elif kind == "actioninput":
            if pending is None:
                errors.append("an Action Input must follow an Action")
                continue
            calls.append(_make_call(pending[0], segment, make_id, tools))
            pending = None
        elif kind == "finalanswer":
            if prose_end is None:
                prose_end = h.start()
            final = text[h.end():].strip()
            break
    if pending is not None:
        calls.append(_make_call(*pending, make_id, tools))
    prose = text[:prose_end] if prose_end is not None else text
    return ParsedReply(calls, final, prose.strip(), errors)
