"""What the console's run page shows beyond the timeline: each model call's messages (derived from the
run's stored state and its model_call events, never stored per call) and a waterfall of its model
calls, tool calls, approvals and sub-agent runs laid out in time.

Model call k's reply is the k-th assistant message of the stored transcript and its input is every
message before it, so the page shows each message once, under the call it was first sent to. The
transcript exists once the run has stopped or parked (its state is written then, not per step)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether._types import CallDecision, Message
from tether.durable._fork import model_turns, said_by_user
from tether.events import TraceEvent

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"  # telemetry's switch (tether.telemetry)
SHOWN_CHARS = 4_000  # of a message; "show all" fetches the rest
MAX_DEPTH = 3  # sub-agents nested below a run in its waterfall


def show_content(env: Mapping[str, str] | None = None) -> bool:
    """Whether the console shows message content: the telemetry switch, read the other way round
    for the run's owner. Telemetry sends content to a collector only when it is `true`; the console
    shows the owner their own stored run unless it is `false` (an operator who keeps content out of
    every view)."""
    env = os.environ if env is None else env
    return env.get(CAPTURE_ENV, "").strip().lower() != "false"


@dataclass(slots=True)
class Shown:
    """One message as the page shows it: at most SHOWN_CHARS of its text."""

    index: int
    role: str
    text: str
    chars: int
    more: bool
    tool_calls: list[tuple[str, str, str]]  # (id, name, arguments as JSON)
    tool_call_id: str | None


@dataclass(slots=True)
class Call:
    """One model call: its event's figures, the messages first sent to it, and its reply."""

    step: int
    data: dict[str, Any]
    sent: list[Shown]
    input_count: int
    reply: Shown | None
    last_user: str = ""  # what a fork from this step would edit (empty when too long to edit here)


@dataclass(slots=True)
class Transcript:
    calls: list[Call] = field(default_factory=list)
    prompt: Shown | None = None
    extra: list[Shown] = field(default_factory=list)  # after the last reply (a parked call's results, say)


def shown(index: int, m: Message) -> Shown:
    text = m.content or ""
    calls = [(c.id, c.name, json.dumps(c.arguments, ensure_ascii=False, default=str)) for c in m.tool_calls]
    return Shown(index, m.role, text[:SHOWN_CHARS], len(text), len(text) > SHOWN_CHARS, calls, m.tool_call_id)


def transcript(messages: list[Message], events: list[TraceEvent]) -> Transcript:
    """The run's model calls with their messages: call k gets the messages after call k-1's reply
    (what was new to it) and its own reply; the figures come from its model_call event (step k),
    which a fork does not have for the calls it kept from its parent."""
    turns = model_turns(messages)
    figures = {e.step: e for e in events if e.kind == "model_call"}  # call k's event has step k
    out = Transcript()
    start = 0
    for k, at in enumerate(turns):
        ev = figures.get(k + 1)  # none for the calls a fork kept from its parent
        data = {**ev.data, "duration": ev.duration, "t": ev.t} if ev else {}
        sent = [shown(i, messages[i]) for i in range(start, at)]
        upto = turns[k + 1] if k + 1 < len(turns) else len(messages)
        last = next((messages[i].content for i in range(upto - 1, -1, -1) if said_by_user(messages[i])), "")
        out.calls.append(Call(k + 1, data, sent, at, shown(at, messages[at]),
                              last if len(last) <= SHOWN_CHARS else ""))
        start = at + 1
    out.extra = [shown(i, messages[i]) for i in range(start, len(messages))]
    users = [i for i in range(turns[0] if turns else len(messages)) if said_by_user(messages[i])]
    out.prompt = shown(users[-1], messages[users[-1]]) if users else None
    return out


@dataclass(slots=True)
class Span:
    """One bar of the waterfall (seconds since the top run started)."""

    kind: str  # model, tool, approval, subagent
    label: str
    start: float
    duration: float
    depth: int
    detail: str = ""
    run_id: str = ""


def spans(events: list[TraceEvent], children: list[tuple[Any, list[TraceEvent], list]] | None = None,
          offset: float = 0.0, depth: int = 0) -> list[Span]:
    """The bars of one run (and, under each sub-agent tool call, its child run's bars): `children`
    are (row, events, grandchildren) of the run's sub-agent runs in the order they started; the
    k-th child named X belongs to the k-th call of the tool X."""
    pending = list(children or [])
    out: list[Span] = []
    for e in events:
        start = offset + max(e.t - e.duration, 0.0)
        d = e.data
        if e.kind == "model_call":
            out.append(Span("model", f"step {e.step} · {d.get('model', '')}", start, e.duration, depth,
                            f"in {d.get('input_tokens', 0)} / out {d.get('output_tokens', 0)} tokens"))
        elif e.kind == "confirm_request":
            out.append(Span("approval", f"approval: {d.get('tool', '')}", offset + e.t, 0.0, depth, "asked a person"))
        elif e.kind == "tool_call":
            if d.get("decision") == CallDecision.AWAITING_APPROVAL:
                continue  # the confirm_request bar says it; the call runs (and gets its bar) once decided
            out.append(Span("tool", f"tool {d.get('name', '')}", start, e.duration, depth, str(d.get("decision", ""))))
            child = next((c for c in pending if c[0].agent == d.get("name")), None)
            if child is not None and depth < MAX_DEPTH:
                pending.remove(child)
                row, child_events, grandchildren = child
                out.append(Span("subagent", f"sub-agent {row.agent}", start, e.duration, depth + 1, row.status,
                                row.run_id))
                out.extend(spans(child_events, grandchildren, start, depth + 2))
    return out


def waterfall(bars: list[Span], width: int = 900, left: int = 260, row: int = 20) -> dict[str, Any]:
    """SVG geometry for `bars` (the page's CSP allows no inline styles: attributes only)."""
    end = max((b.start + b.duration for b in bars), default=0.0) or 1.0
    scale = (width - left - 80) / end
    rows = [{"y": i * row, "x": round(left + b.start * scale, 1), "w": max(round(b.duration * scale, 1), 2.0),
             "indent": 4 + 12 * b.depth, "bar": b} for i, b in enumerate(bars)]
    return {"width": width, "height": max(row * len(rows), row), "left": left, "rows": rows, "end": end}
