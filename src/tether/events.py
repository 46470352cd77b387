"""Typed run events: one small dataclass per kind, a discriminated union, JSON both ways.

The loop builds these and emits each as its envelope, a `TraceEvent(kind, step, t, duration, data)`:
the form that is stored, streamed (the SSE event name is the kind) and kept in `RunResult.trace`.
`typed(envelope)` gives the event back, `RunResult.events` the whole run's:

    for event in result.events:
        match event:
            case ToolCallEnded(name=name, decision=decision) if not event.ran: ...
            case ModelCallEnded(input_tokens=n): ...

A step's start and end are both events (`model_call_started` / `model_call`, `tool_call_started` /
`tool_call`), so a trace span or a console row can open when the step begins. The kind names of the
end events (`model_call`, `tool_call`, `text_delta`, `stop`) are those tether always used, so stored
runs and stream clients read on unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, Literal, Union, get_args

from pydantic import Field, TypeAdapter
from typing_extensions import TypeVar

from tether._errors import InvalidInput
from tether._fields import new_dict, new_list

# Process-wide observers of every run's typed events (tether.telemetry registers one): called as
# observer(run_id, event) right after the event is stamped. An observer that raises is dropped.
Observer = Callable[[str, "BaseEvent"], None]
OBSERVERS: list[Observer] = []


@dataclass(slots=True)
class TraceEvent:
    """An event's envelope: its kind, when, and its payload as a dict. The stored and streamed form
    (`RunResult.trace`); `typed()` gives the typed event back."""

    kind: str
    step: int
    t: float  # seconds since the run started (run clock)
    duration: float = 0.0
    data: dict[str, Any] = field(default_factory=new_dict)


# An event type's kind, a Literal: each type narrows the base's `kind` through its type parameter, so
# every checker reads the override as the same type (pydantic's discriminator is that field).
K = TypeVar("K", bound=str, default=str, covariant=True)


@dataclass(slots=True, kw_only=True)
class BaseEvent(Generic[K]):
    """What every event has: its kind, when (the run's step and seconds) and how long."""

    step: int = 0  # model calls made before it
    t: float = 0.0  # seconds since the run started
    duration: float = 0.0
    kind: K  # after the times, where it always stood (each event type gives its default)

    @property
    def data(self) -> dict[str, Any]:
        """The payload (every field but step, t and duration), as the envelope carries it."""
        payload = _PAYLOADS.get(type(self)) or _payload(type(self))
        return payload(self)

    def envelope(self) -> TraceEvent:
        payload = _PAYLOADS.get(type(self)) or _payload(type(self))
        return TraceEvent(self.kind, self.step, self.t, self.duration, payload(self))


_PAYLOADS: dict[type, Callable[[Any], dict[str, Any]]] = {}


def _payload(tp: type) -> Callable[[Any], dict[str, Any]]:
    """An event class's payload as one function, `{"name": e.name, ...}` (made once per class: an
    event's envelope is built for every step; a dict display is one step, where `dataclasses.fields`
    walks every field and `dict(zip(...))` iterates)."""
    own = getattr(tp, "data", None)
    if isinstance(own, property) and own is not vars(BaseEvent)["data"] and own.fget is not None:  # (Notice's)
        _PAYLOADS[tp] = own.fget
        return own.fget
    names = tuple(f.name for f in dataclasses.fields(tp) if f.name not in ("kind", "step", "t", "duration"))
    assert all(name.isidentifier() for name in names)  # field names: safe to write into the source below
    source = "lambda e: {" + ", ".join(f"{name!r}: e.{name}" for name in names) + "}"
    payload: Callable[[Any], dict[str, Any]] = eval(source)
    _PAYLOADS[tp] = payload
    return payload


@dataclass(slots=True, kw_only=True)
class RunStarted(BaseEvent[Literal["run_started"]]):
    kind: Literal["run_started"] = "run_started"
    run_id: str = ""
    user: str | None = None
    resumed: bool = False  # continued from a RunState that had run before
    agent: str = ""  # the agent's name (Agent.name)
    model: str = ""  # the run's model, and where it is served (for traces: GenAI provider, server host)
    provider: str = ""
    server_address: str = ""


@dataclass(slots=True, kw_only=True)
class ModelCallStarted(BaseEvent[Literal["model_call_started"]]):
    kind: Literal["model_call_started"] = "model_call_started"
    model: str = ""
    messages: int = 0
    purpose: str = "step"  # step, final (the partial answer), context (compaction, a critic)


@dataclass(slots=True, kw_only=True)
class ModelCallEnded(BaseEvent[Literal["model_call"]]):
    kind: Literal["model_call"] = "model_call"
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    tool_calls: int = 0
    text_chars: int = 0
    purpose: str = "step"  # also "lost": a durable call a crash cut off, charged at its admitted maximum
    final: bool = False
    finish_reason: str = ""  # the provider's (stop, tool_calls, end_turn, length, ...), "" when it gave none


@dataclass(slots=True, kw_only=True)
class TextStreamed(BaseEvent[Literal["text_delta"]]):
    kind: Literal["text_delta"] = "text_delta"
    text: str = ""


@dataclass(slots=True, kw_only=True)
class ToolCallStarted(BaseEvent[Literal["tool_call_started"]]):
    kind: Literal["tool_call_started"] = "tool_call_started"
    name: str = ""
    call_id: str = ""
    arguments: dict[str, Any] = field(default_factory=new_dict)
    index: int = 0  # its place in the model's reply (the idempotency key is run:step:index)


PREVIEW_CHARS = 1_000


@dataclass(slots=True, kw_only=True)
class ToolCallEnded(BaseEvent[Literal["tool_call"]]):
    kind: Literal["tool_call"] = "tool_call"
    name: str = ""
    call_id: str = ""
    arguments: dict[str, Any] = field(default_factory=new_dict)
    decision: str = ""  # the policy's: allowed, approved:<by>, refused:<why>, denied:<by>, awaiting_approval, ...
    is_error: bool = False
    result_chars: int = 0
    truncated: bool = False
    preview: str = ""  # the start of what the model was shown (PREVIEW_CHARS at most), for consoles and traces
    handle: str | None = None  # the whole result's key in the results store, when it was capped

    @property
    def ran(self) -> bool:
        """Whether the tool itself ran and returned (not refused, pending, failed or timed out)."""
        return not self.is_error


@dataclass(slots=True, kw_only=True)
class ApprovalRequested(BaseEvent[Literal["approval_requested"]]):
    kind: Literal["approval_requested"] = "approval_requested"
    call_id: str = ""
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=new_dict)
    reason: str = ""
    batch: str = ""  # set when the call is asked about with others of its turn (one question)
    batch_summary: str = ""


@dataclass(slots=True, kw_only=True)
class ApprovalDecided(BaseEvent[Literal["approval_decided"]]):
    kind: Literal["approval_decided"] = "approval_decided"
    call_id: str = ""
    approved: bool = False
    by: str = ""
    batch: str = ""  # the batch whose one answer decided this call, if any


@dataclass(slots=True, kw_only=True)
class Notice(BaseEvent[Literal["notice"]]):
    """Something the run did that is not a step: a redaction, a budget skip, a suppressed repeat."""

    kind: Literal["notice"] = "notice"
    notice: dict[str, Any] = field(default_factory=new_dict)

    @property
    def data(self) -> dict[str, Any]:
        return dict(self.notice)  # the envelope carries the notice's own keys, as it always did


@dataclass(slots=True, kw_only=True)
class Error(BaseEvent[Literal["error"]]):
    kind: Literal["error"] = "error"
    error: str = ""


@dataclass(slots=True, kw_only=True)
class RunStopped(BaseEvent[Literal["stop"]]):
    kind: Literal["stop"] = "stop"
    stop_reason: str = ""
    steps: int = 0


@dataclass(slots=True, kw_only=True)
class CriticReviewed(BaseEvent[Literal["critic"]]):
    kind: Literal["critic"] = "critic"
    ok: bool = True
    reasons: list[str] = field(default_factory=new_list)
    input_tokens: int = 0


@dataclass(slots=True, kw_only=True)
class FilterVerdict(BaseEvent[Literal["filter_verdict"]]):
    """The safety filter's verdict on the user's request (`input`) or the final answer (`output`)."""

    kind: Literal["filter_verdict"] = "filter_verdict"
    side: str = "input"  # input | output
    score: float = 0.0
    threshold: float = 0.0
    flagged: bool = False  # score >= threshold: the request was refused, or the answer withheld
    reasons: list[str] = field(default_factory=new_list)  # the matched rules' reasons
    matched: list[str] = field(default_factory=new_list)  # the matched rules' names
    cached: bool = False  # answered from the verdict cache


@dataclass(slots=True, kw_only=True)
class JobStarted(BaseEvent[Literal["job_started"]]):
    """A job tool's call started its job in the background (docs/jobs.md); the call was answered at once."""

    kind: Literal["job_started"] = "job_started"
    job_id: str = ""
    name: str = ""
    call_id: str = ""
    arguments: dict[str, Any] = field(default_factory=new_dict)
    key: str = ""  # its idempotency key (run:step:index)


@dataclass(slots=True, kw_only=True)
class JobEnded(BaseEvent[Literal["job_ended"]]):
    """A job ended: done, failed, cancelled or lost (its process died while it ran)."""

    kind: Literal["job_ended"] = "job_ended"
    job_id: str = ""
    name: str = ""
    status: str = ""
    is_error: bool = False
    result_chars: int = 0
    preview: str = ""


# The union of every event type, and the type `typed`, `from_json` and `RunResult.events` give: a `match`
# or an `isinstance` on it narrows to one type. The Annotated form tells pydantic to pick by `kind`.
Event = Annotated[
    Union[RunStarted, ModelCallStarted, ModelCallEnded, TextStreamed, ToolCallStarted,  # noqa: UP007
          ToolCallEnded, ApprovalRequested, ApprovalDecided, Notice, Error, RunStopped, CriticReviewed,
          FilterVerdict, JobStarted, JobEnded],
    Field(discriminator="kind"),
]
EVENT_TYPES: dict[str, type[Event]] = {
    tp.__dataclass_fields__["kind"].default: tp for tp in get_args(get_args(Event)[0])
}
START_KINDS = frozenset({"run_started", "model_call_started", "tool_call_started"})
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
_LIST: TypeAdapter[list[Event]] = TypeAdapter(list[Event])


def typed(envelope: TraceEvent) -> Event:
    """The typed event of an envelope (unknown payload keys are ignored; a kind tether does not know
    raises ValueError)."""
    tp = EVENT_TYPES.get(envelope.kind)
    if tp is None:
        raise InvalidInput(f"unknown event kind {envelope.kind!r}; known: {', '.join(sorted(EVENT_TYPES))}")
    if tp is Notice:
        return Notice(notice=dict(envelope.data), step=envelope.step, t=envelope.t, duration=envelope.duration)
    names = _FIELDS[tp]
    return tp(step=envelope.step, t=envelope.t, duration=envelope.duration,
              **{k: v for k, v in envelope.data.items() if k in names})


# each type's payload fields (all but kind and the times), which an envelope's data may set
_FIELDS: dict[type[Event], frozenset[str]] = {
    tp: frozenset(f.name for f in dataclasses.fields(tp)) - {"kind", "step", "t", "duration"}
    for tp in EVENT_TYPES.values()
}


def stored(envelope: TraceEvent) -> Event:
    """`typed`, for events read back from storage: a kind this version does not know (written by a
    newer one) comes back as a Notice carrying its kind and data, instead of an error."""
    try:
        return typed(envelope)
    except ValueError:
        return Notice(notice={"kind": envelope.kind, **envelope.data}, step=envelope.step, t=envelope.t,
                      duration=envelope.duration)


def to_json(event: Event) -> str:
    return _ADAPTER.dump_json(event).decode()


def from_json(data: str | bytes) -> Event:
    """An event from `to_json`'s JSON (the type its `kind` names)."""
    return _ADAPTER.validate_json(data)


def list_to_json(events: list[Event]) -> str:
    return _LIST.dump_json(events).decode()
