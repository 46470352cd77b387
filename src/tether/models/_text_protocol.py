"""Tool calling for models that only produce text (small local models, base models, servers
without native tool calling).

`TextProtocolModel(inner, "tagged" | "react")` wraps any `Model`: it describes the tools in the
system prompt, renders the tether history as a plain text dialogue, parses the reply back into
tool calls or a final answer, and nudges the model when the reply follows neither format.

- tagged: `<tool_call>{"name": "...", "arguments": {...}}</tool_call>` (several per reply),
  `<final>...</final>`; results come back as `<tool_result name=".." id="..">..</tool_result>`.
- react: `Thought:` / `Action:` / `Action Input: {json}`, `Observation:` for results,
  `Final Answer:` to finish.

Tool results go back as user messages: small chat templates have no tool role. A reply that is
neither a call nor a final answer is nudged up to `max_nudges` times; after that its plain text
is taken as the final answer (a model that keeps ignoring the format has nothing better to give,
and the loop's limits still bound the run). The pieces (`render_tools_prompt`, `render_messages`,
`parse_tagged`, `parse_react`, `render_call`) are public so the embedded model can reuse them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from types import ModuleType
from typing import Any, Literal, cast

from tether._errors import InvalidInput
from tether._types import Message, ModelReply, ModelRequest, TextDelta, ToolCall, ToolSpec, Usage
from tether.models import _react, _tagged
from tether.models._base import Model, stream_by_completing
from tether.models._react import parse_react
from tether.models._tagged import parse_tagged
from tether.models._text_common import IdMaker, ParsedReply, id_maker

__all__ = [
    "ParsedReply",
    "TextProtocol",
    "TextProtocolModel",
    "compact_schema",
    "nudge_text",
    "parse_react",
    "parse_reply",
    "parse_tagged",
    "render_call",
    "render_messages",
    "render_tools_prompt",
]

TextProtocol = Literal["tagged", "react"]
_MODULES: dict[str, ModuleType] = {"tagged": _tagged, "react": _react}


def _module(protocol: str) -> ModuleType:
    try:
        return _MODULES[protocol]
    except KeyError:
        raise InvalidInput(f"unknown text protocol {protocol!r}; use 'tagged' or 'react'") from None


def _strip_titles(node: Any, in_properties: bool = False) -> Any:
    """Drop pydantic's `title` keywords (tokens the model does not need); property names stay."""
    if isinstance(node, dict):
        if in_properties:
            return {k: _strip_titles(v) for k, v in node.items()}
        return {k: _strip_titles(v, k in ("properties", "$defs", "definitions"))
                for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def compact_schema(schema: dict[str, Any]) -> str:
    """A tool's JSON Schema on one line, without titles."""
    return json.dumps(_strip_titles(schema), separators=(",", ":"), ensure_ascii=False, default=str)


def _placeholder(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return "..."
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}, "null": None}.get(
        cast(str, kind), "...")


def _example(tool: ToolSpec, protocol: TextProtocol) -> str:
    props = tool.parameters.get("properties", {}) if isinstance(tool.parameters, dict) else {}
    props = props if isinstance(props, dict) else {}
    required = tool.parameters.get("required") if isinstance(tool.parameters, dict) else None
    keys = [k for k in required if k in props] if isinstance(required, list) else list(props)
    call = ToolCall("example", tool.name, {k: _placeholder(props[k]) for k in keys})
    return render_call(call, protocol)


def render_call(call: ToolCall, protocol: TextProtocol = "tagged") -> str:
    """One tool call written the way the protocol asks the model to write it."""
    return cast(str, _module(protocol).render_call(call))


_TAGGED_FORMAT = """\
To call a tool, reply with a block like this (several blocks in one reply are allowed):
<tool_call>{{"name": "TOOL_NAME", "arguments": {{...}}}}</tool_call>
Then stop: each result comes back as <tool_result name="TOOL_NAME" id="CALL_ID">...</tool_result>.
When you have the answer, reply with:
<final>your answer</final>
Example: {example}
Every reply is either tool calls or a final answer."""

_REACT_FORMAT = """\
Use this format:
Thought: what to do next
Action: the tool to use, one of [{names}]
Action Input: the arguments as a JSON object
(several Action / Action Input pairs in one reply are allowed; then stop)
Observation: the result, written for you, never by you
... (Thought / Action / Action Input / Observation repeat as needed)
Thought: I know the answer
Final Answer: the answer
Example:
{example}"""

_NO_TOOLS = {
    "tagged": "No tools are available now. Reply with your answer as plain text, without <tool_call> blocks.",
    "react": "No tools are available now. Reply with your answer as plain text, without Action lines.",
}


def render_tools_prompt(tools: Sequence[ToolSpec], protocol: TextProtocol = "tagged") -> str:
    """The system-prompt section that lists the tools and explains the call format.

    With no tools it asks for a plain answer instead.
    """
    _module(protocol)
    if not tools:
        return _NO_TOOLS[protocol]
    lines = ["You can use these tools:"]
    for t in tools:
        desc = " ".join(t.description.split())
        lines.append(f"- {t.name}: {desc}\n  arguments: {compact_schema(t.parameters)}")
    example = _example(tools[0], protocol)
    if protocol == "tagged":
        fmt = _TAGGED_FORMAT.format(example=example)
    else:
        fmt = _REACT_FORMAT.format(names=", ".join(t.name for t in tools), example=example)
    return "\n".join(lines) + "\n\n" + fmt


def nudge_text(protocol: TextProtocol, tools: Sequence[ToolSpec], errors: Sequence[str] = ()) -> str:
    """The reminder sent when a reply is neither a tool call nor a final answer."""
    why = f" ({'; '.join(errors[:3])})" if errors else ""
    names = ", ".join(t.name for t in tools)
    if protocol == "tagged":
        return (f"Your reply did not follow the format{why}. Reply again with either one or more "
                '<tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call> blocks '
                f"(tools: {names}) or <final>your answer</final>.")
    return (f"Your reply did not follow the format{why}. Reply again with either\n"
            f"Action: one of [{names}]\nAction Input: the arguments as a JSON object\n"
            "or\nFinal Answer: your answer")


def render_messages(messages: Sequence[Message], protocol: TextProtocol = "tagged",
                    tools: Sequence[ToolSpec] | None = None) -> list[Message]:
    """Turn a tether history into a text dialogue of system, user and assistant messages.

    Assistant tool calls are written in the protocol's format, tool results become user
    messages, and consecutive user messages are merged (some templates need alternation). With
    `tools` (even empty) the tools prompt is appended to the first system message (one is added
    if there is none); with `tools=None` the messages are only converted. Deterministic: the same
    history always renders to the same text.
    """
    mod = _module(protocol)
    out: list[Message] = []
    names: dict[str, str] = {}

    def add(role: Literal["system", "user", "assistant"], content: str) -> None:
        if role == "user" and out and out[-1].role == "user":
            out[-1] = Message("user", f"{out[-1].content}\n\n{content}")
        else:
            out.append(Message(role, content))

    for msg in messages:
        if msg.role == "assistant":
            for c in msg.tool_calls:
                names[c.id] = c.name
            add("assistant", mod.render_assistant(msg))
        elif msg.role == "tool":
            call_id = msg.tool_call_id or ""
            add("user", mod.render_result(msg.name or names.get(call_id, ""), call_id, msg.content))
        else:
            add(msg.role, msg.content)
    if tools is not None:
        prompt = render_tools_prompt(tools, protocol)
        if out and out[0].role == "system":
            first = out[0].content.rstrip()
            out[0] = Message("system", f"{first}\n\n{prompt}" if first else prompt)
        else:
            out.insert(0, Message("system", prompt))
    return out


def parse_reply(text: str, protocol: TextProtocol = "tagged", *, make_id: IdMaker | None = None,
                tools: Sequence[ToolSpec] | None = None) -> ParsedReply:
    """Parse a reply in either protocol. Never raises."""
    parse = parse_tagged if _module(protocol) is _tagged else parse_react
    return parse(text, make_id=make_id, tools=tools)


class TextProtocolModel:
    """Any `Model`, given tool calling through a text protocol (`"tagged"` or `"react"`).

    The inner model gets no native tools: the tools are described in its system prompt and its
    text replies are parsed. Nudge calls happen inside one `complete` and their usage is summed
    into the returned reply. Call ids are `call_<n>`, counting on from the calls in the history,
    so a replayed run gets the same ids.
    """

    def __init__(self, inner: Model, protocol: TextProtocol = "tagged", *, max_nudges: int = 1) -> None:
        _module(protocol)
        if not isinstance(max_nudges, int) or max_nudges < 0:
            raise InvalidInput(f"max_nudges must be an integer >= 0, got {max_nudges!r}")
        self.inner = inner
        self.protocol: TextProtocol = protocol
        self.max_nudges = max_nudges
        self.name = inner.name

    def _inner_request(self, request: ModelRequest, messages: list[Message]) -> ModelRequest:
        stop = list(request.stop)
        marker = _module(self.protocol).STOP
        if request.tools and request.tool_choice != "none" and marker not in stop:
            stop.append(marker)
        return ModelRequest(messages, [], request.max_output_tokens, request.temperature, stop)

    async def complete(self, request: ModelRequest) -> ModelReply:
        tools = request.tools if request.tool_choice != "none" else []  # "none": a tool-free call
        used: set[str] = set()
        n_calls = 0
        for m in request.messages:
            n_calls += len(m.tool_calls)
            used.update(c.id for c in m.tool_calls)
        messages = render_messages(request.messages, self.protocol, tools)
        usage = Usage()
        reply: ModelReply | None = None
        parsed: ParsedReply | None = None
        for attempt in range(self.max_nudges + 1 if tools else 1):
            reply = await self.inner.complete(self._inner_request(request, messages))
            usage.add(reply.usage)
            parsed = parse_reply(reply.text, self.protocol, make_id=id_maker(used, n_calls + 1), tools=tools)
            if not tools:  # a tool-free call: whatever it wrote is the answer
                answer = parsed.final if parsed.final is not None else (parsed.text or reply.text.strip())
                return ModelReply(answer, [], usage, reply.model, reply.finish_reason)
            if parsed.calls:
                return ModelReply(parsed.text, parsed.calls, usage, reply.model, "tool_calls")
            if parsed.final is not None:
                return ModelReply(parsed.final, [], usage, reply.model, reply.finish_reason)
            if attempt < self.max_nudges:
                messages = [*messages, Message.assistant(reply.text),
                            Message.user(nudge_text(self.protocol, tools, parsed.errors))]
        # nudges used up: the plain text is the answer
        assert reply is not None and parsed is not None  # the loop runs at least once
        return ModelReply(parsed.text or reply.text.strip(), [], usage, reply.model, reply.finish_reason)

    def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        # parsing needs the whole reply, so the text arrives in one piece
        return stream_by_completing(self, request)
