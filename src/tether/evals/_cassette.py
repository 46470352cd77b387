"""Cassettes: a run's model replies and tool responses in one JSON file, replayed with no network.

A cassette is `{"version": 1, "model": [...], "tools": [...]}`. Model records are those of
`RecordingModel` (each keyed by a fingerprint of the request, so a replay that asks something
else is caught); tool records are `{"name", "arguments", "content"}` (or `"error": [type, message]`), keyed by the tool name and
canonical arguments. Replaying wraps the real tools (same schema, effect and policy metadata), so
the executor and the policy check every replayed call exactly as they checked the live one.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from tether._errors import InvalidInput, TetherError
from tether._types import ModelReply, ModelRequest, RunState, TextDelta, to_jsonable
from tether.models._base import ModelError
from tether.models._scripted import ReplayModel, request_fingerprint, transcript_fingerprint
from tether.policy._canonical import canonical_json
from tether.tools._base import Tool
from tether.tools._results import ToolOutput, shape

VERSION = 1


class Drift(TetherError):
    """A replayed run asked for something the cassette does not hold."""


@dataclasses.dataclass
class Cassette:
    model: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> Cassette:
        try:
            data = json.loads(Path(path).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot read cassette {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise InvalidInput(f"{path} is not a version-{VERSION} tether cassette")
        return cls(list(data.get("model", [])), list(data.get("tools", [])))

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"version": VERSION, "model": self.model, "tools": self.tools}
        path.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n", "utf-8")


def _key(name: str, arguments: dict[str, Any]) -> str:
    return name + ":" + canonical_json(arguments)


def _public_args(tool: Tool, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k != tool.context_param}


def cassette_from_state(state: RunState) -> Cassette:
    """A cassette from a stored run's transcript (`RunStore.state(run_id)`): each assistant message is a
    model reply, each tool message the response to its call. Each reply carries a fingerprint of the
    messages before it (not of the tools offered, which the transcript does not say), so a replay
    whose prompts, instructions or tool results differ is reported as drift; capped results replay
    as the capped text the model saw."""
    calls = {c.id: c for m in state.messages for c in m.tool_calls}
    cassette = Cassette()
    for i, m in enumerate(state.messages):
        if m.role == "assistant":  # the messages before it are what the model was sent: a replay checks them
            cassette.model.append({"request": None, "transcript": transcript_fingerprint(state.messages[:i]),
                                   "messages": i, "reply": to_jsonable(ModelReply(m.content, list(m.tool_calls)))})
        elif m.role == "tool" and m.tool_call_id in calls:
            call = calls[m.tool_call_id]
            record: dict[str, Any] = {"name": call.name, "arguments": call.arguments}
            if m.content.startswith("ERROR: tool failed - "):  # replayed as the same failure
                name, _, message = m.content.removeprefix("ERROR: tool failed - ").partition(": ")
                record["error"] = [name, message]
            elif m.content.startswith(("ERROR: ", "PENDING: ")):
                continue  # refused or not run: the executor, not the tool, said so; a replay decides again
            else:
                record["content"] = m.content
            cassette.tools.append(record)
    return cassette


class CassetteRecorder:
    """Wraps a model and tools so one run is written to a `Cassette`."""

    def __init__(self, model: Any) -> None:
        self.cassette = Cassette()
        self.inner = model
        self.name = getattr(model, "name", "recorded")

    async def complete(self, request: ModelRequest) -> ModelReply:
        out: ModelReply = await self.inner.complete(request)
        self.cassette.model.append({"request": request_fingerprint(request), "messages": len(request.messages),
                                    "reply": to_jsonable(out)})
        return out

    def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        from tether.models._base import stream_by_completing

        return stream_by_completing(self, request)

    def wrap_tools(self, tools: Iterable[Tool]) -> list[Tool]:
        return [self._wrap(t) for t in tools]

    def _wrap(self, tool: Tool) -> Tool:
        async def recorded(**kwargs: Any) -> str | ToolOutput:
            record: dict[str, Any] = {"name": tool.name, "arguments": _public_args(tool, kwargs)}
            try:
                value = tool.fn(**kwargs)
                if tool.is_async:
                    value = await value
                record["content"] = text = shape(value)
                if isinstance(value, ToolOutput):
                    record["untrusted"] = value.untrusted
            except Exception as exc:  # replayed as the same failure, so the model sees the same text
                record["error"] = [type(exc).__name__, str(exc)]
                raise
            finally:
                self.cassette.tools.append(record)
            return ToolOutput(text, record["untrusted"]) if "untrusted" in record else text

        return dataclasses.replace(tool, fn=recorded)


class CassettePlayer:
    """Replays a cassette: `model` answers from the recorded replies, `wrap_tools` returns the
    recorded responses. Everything the run asked that the cassette lacks is listed in `drift`."""

    def __init__(self, cassette: Cassette, *, strict: bool = True) -> None:
        self.drift: list[str] = []
        self.model = _DriftReportingReplay(cassette.model, strict, self.drift)
        self._responses: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        for rec in cassette.tools:
            self._responses[_key(rec["name"], rec.get("arguments", {}))].append(rec)

    def wrap_tools(self, tools: Iterable[Tool]) -> list[Tool]:
        return [self._wrap(t) for t in tools]

    def _wrap(self, tool: Tool) -> Tool:
        async def replayed(**kwargs: Any) -> str | ToolOutput:
            args = _public_args(tool, kwargs)
            queue = self._responses.get(_key(tool.name, args))
            if not queue:
                what = f"tool {tool.name} called with {canonical_json(args)}, which the cassette does not hold"
                self.drift.append(what)
                raise Drift(what + "; re-record the cassette")
            rec = queue[0] if len(queue) == 1 else queue.popleft()  # the last response repeats
            if "error" in rec:
                name, message = rec["error"]
                raise type(name, (Exception,), {})(message)  # same type name and message as recorded
            return ToolOutput(rec["content"], rec["untrusted"]) if "untrusted" in rec else rec["content"]

        return dataclasses.replace(tool, fn=replayed)


class _DriftReportingReplay(ReplayModel):
    def __init__(self, records: list[dict[str, Any]], strict: bool, drift: list[str]) -> None:
        super().__init__(records, strict=strict)
        self._drift = drift

    async def complete(self, request: ModelRequest) -> ModelReply:
        try:
            return await super().complete(request)
        except ModelError as exc:
            self._drift.append(f"model call {self._next}: {exc}")
            raise
