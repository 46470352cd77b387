"""Test models: drive the loop without a network.

- `ScriptedModel`: replies from a list (or a function of the request), in order.
- `RecordingModel`: wraps any model and writes each request and reply to a JSONL cassette.
- `ReplayModel`: replays a cassette, optionally checking that the requests match.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from tether._errors import InvalidInput
from tether._types import (
    Message,
    ModelReply,
    ModelRequest,
    TextDelta,
    ToolCall,
    Usage,
    from_jsonable,
    to_jsonable,
)
from tether.models._base import ModelError, stream_by_completing

_ids = itertools.count(1)


def call(name: str, /, **arguments: Any) -> ToolCall:
    """A tool call for scripts: `call("add", a=1, b=2)`."""
    return ToolCall(f"call_{next(_ids)}", name, arguments)


def reply(text: str = "", *calls: ToolCall, input_tokens: int = 0, output_tokens: int = 0) -> ModelReply:
    """A scripted model reply with optional tool calls and token counts."""
    return ModelReply(text, list(calls), Usage(input_tokens=input_tokens, output_tokens=output_tokens))


ScriptItem = ModelReply | str | ToolCall | list[ToolCall]
ScriptFn = Callable[[ModelRequest], ScriptItem]


def _as_reply(item: ScriptItem) -> ModelReply:
    if isinstance(item, ModelReply):
        # a fresh copy, so a script can reuse one reply object and tool calls keep unique ids
        return ModelReply(item.text, list(item.tool_calls), Usage(item.usage.input_tokens, item.usage.output_tokens),
                          item.model, item.finish_reason)
    if isinstance(item, str):
        return ModelReply(item)
    if isinstance(item, ToolCall):
        return ModelReply("", [item])
    return ModelReply("", list(item))


class ScriptedModel:
    """Replies from a script: a list of items (ModelReply, text, ToolCall, list of ToolCalls) or a
    function of the request returning one. Records every request it receives in `requests`.

    A list that runs out raises ModelError, so a test notices a loop that asked for more than
    it scripted. `usage` fills token counts for replies that carry none (handy for budgets).
    `stream_chunk` streams a reply's text in pieces of that many characters, `stream_delay` seconds
    apart (as a served model does); without it the text comes as one piece.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] | ScriptFn,
        *,
        name: str = "scripted",
        usage: Usage | None = None,
        stream_chunk: int | None = None,
        stream_delay: float = 0.0,
    ) -> None:
        if stream_chunk is not None and stream_chunk < 1:
            raise InvalidInput("stream_chunk must be at least 1")
        self.stream_chunk = stream_chunk
        self.stream_delay = stream_delay
        self.name = name
        self._fn: ScriptFn | None = script if callable(script) else None
        self._items: list[ScriptItem] = [] if callable(script) else list(script)
        self._next = 0
        self.default_usage = usage
        self.requests: list[ModelRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    async def complete(self, request: ModelRequest) -> ModelReply:
        # The loop passes its live transcript; keep what the model saw at this call.
        seen = dataclasses.replace(request, messages=list(request.messages))
        self.requests.append(seen)
        if self._fn is not None:
            item = self._fn(seen)
        else:
            if self._next >= len(self._items):
                raise ModelError(f"ScriptedModel ran out of replies after {len(self._items)} calls")
            item = self._items[self._next]
            self._next += 1
        out = _as_reply(item)
        out.model = out.model or self.name
        if self.default_usage is not None and out.usage.total_tokens == 0:
            out.usage = Usage(self.default_usage.input_tokens, self.default_usage.output_tokens)
        return out

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        if self.stream_chunk is None:
            async for item in stream_by_completing(self, request):
                yield item
            return
        out = await self.complete(request)
        for start in range(0, len(out.text), self.stream_chunk):
            if self.stream_delay:
                await asyncio.sleep(self.stream_delay)
            yield TextDelta(out.text[start:start + self.stream_chunk])
        yield out


def request_fingerprint(request: ModelRequest) -> str:
    """A short hash of what the model was asked (messages and tool names), for replay checks."""
    return _fingerprint({"messages": _message_body(request.messages), "tools": [t.name for t in request.tools]})


def transcript_fingerprint(messages: list[Message]) -> str:
    """A short hash of the messages alone: what a cassette exported from a stored transcript can check
    (the transcript does not say which tools were offered)."""
    return _fingerprint({"messages": _message_body(messages)})


def _message_body(messages: list[Message]) -> list[Any]:
    return [[m.role, m.content, [[c.name, c.arguments] for c in m.tool_calls]] for m in messages]


def _fingerprint(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


class RecordingModel:
    """Wraps a model and appends `{"request": fingerprint, "messages": n, "reply": ...}` per call
    to a JSONL cassette that `ReplayModel` can replay."""

    def __init__(self, inner: Any, path: str | Path) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "recorded")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, request: ModelRequest, out: ModelReply) -> None:
        record = {"request": request_fingerprint(request), "messages": len(request.messages),
                  "reply": to_jsonable(out)}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    async def complete(self, request: ModelRequest) -> ModelReply:
        out: ModelReply = await self.inner.complete(request)
        self._write(request, out)
        return out

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        async for item in self.inner.stream(request):
            if isinstance(item, ModelReply):
                self._write(request, item)
            yield item


class ReplayModel:
    """Replays a cassette written by `RecordingModel`, in order.

    With `strict=True` each request must match the recorded fingerprint, so a change in prompts,
    tools or tool results shows up as a clear error instead of a silently different run.
    """

    def __init__(self, cassette: str | Path | list[dict[str, Any]], *, strict: bool = True, name: str = "replay") -> None:
        if isinstance(cassette, list):
            records = cassette
        else:
            lines = Path(cassette).read_text(encoding="utf-8").splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
        self.records = records
        self.strict = strict
        self.name = name
        self._next = 0

    async def complete(self, request: ModelRequest) -> ModelReply:
        if self._next >= len(self.records):
            raise ModelError(f"ReplayModel: the cassette has only {len(self.records)} replies")
        record = self.records[self._next]
        self._next += 1
        recorded = record.get("request")
        if recorded is None and record.get("transcript") is not None:  # exported from a stored run
            mismatch = record["transcript"] != transcript_fingerprint(request.messages)
        else:
            mismatch = recorded not in (None, request_fingerprint(request))
        if self.strict and mismatch:
            raise ModelError(
                f"ReplayModel: request {self._next} differs from the recording "
                f"(recorded {record.get('messages')} messages, got {len(request.messages)}); "
                "re-record the cassette or use strict=False"
            )
        return from_jsonable(ModelReply, record["reply"])

    def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        return stream_by_completing(self, request)


__all__ = ["Message", "RecordingModel", "ReplayModel", "ScriptedModel", "call", "reply"]
