"""Provider-neutral, serialisable types shared by the loop, models, tools, store and evals.

Plain dataclasses keep construction cheap on the hot path; `to_json` / `from_json` go through
pydantic's TypeAdapter so every type round-trips through JSON without hand-written codecs.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Generic, Literal

from pydantic import TypeAdapter
from typing_extensions import TypeVar

from tether._errors import InvalidInput
from tether._fields import new_dict, new_list
from tether.events import Event, ModelCallEnded, TraceEvent, stored

Role = Literal["system", "user", "assistant", "tool"]

T = TypeVar("T")
OutputT = TypeVar("OutputT", default=Any)  # a bare RunResult is RunResult[Any]


class StopReason(enum.StrEnum):
    """Why a run ended. Every run ends with exactly one."""

    COMPLETED = "completed"
    MAX_STEPS = "max_steps"
    TOKEN_BUDGET = "token_budget"
    TIME_BUDGET = "time_budget"
    COST_BUDGET = "cost_budget"
    TOOL_CALL_BUDGET = "tool_call_budget"
    LOOP_DETECTED = "loop_detected"
    APPROVAL_BUDGET = "approval_budget"  # the safety policy asked for approval, or was denied, too often
    CANCELLED = "cancelled"
    AWAITING_APPROVAL = "awaiting_approval"
    OUTPUT_INVALID = "output_invalid"  # an output type was asked for; no reply validated against it
    INPUT_REFUSED = "input_refused"  # the input filter refused the request: no model call was made
    OUTPUT_REFUSED = "output_refused"  # the output filter withheld the final answer
    ERROR = "error"


class CallDecision(enum.StrEnum):
    """What became of a tool call (`ToolResult.decision`, the tool_call event's, the audit record's): one
    of these, alone or with `:<who or why>` after it (approved:alice, refused:taint, denied:bob). A
    str, so `decision == CallDecision.AWAITING_APPROVAL` and `decision == "awaiting_approval"` agree."""

    ALLOWED = "allowed"
    APPROVED = "approved"  # approved:<by>
    REFUSED = "refused"  # refused:<why>, by the policy (taint, egress, secret, ceiling, ...)
    DENIED = "denied"  # denied:<by>, by the person asked
    WITHHELD = "withheld"  # it ran, but the policy kept its result from the model
    AWAITING_APPROVAL = "awaiting_approval"  # parked: the run stops until a person decides
    DEFERRED = "deferred"  # held back until the untrusted content it would act on is summarised
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"  # a background job whose process died
    LOOP_DETECTED = "loop_detected"
    REPEAT_SUPPRESSED = "repeat_suppressed"
    TOOL_CALL_BUDGET = "tool_call_budget"

    @classmethod
    def of(cls, decision: str) -> CallDecision | None:
        """The decision's kind, without what follows its colon; None for one tether does not make."""
        try:
            return cls(decision.partition(":")[0])
        except ValueError:
            return None


# A tool call's decision that ends its run with StopReason.APPROVAL_BUDGET (a policy's refusal)
APPROVAL_BUDGET_DECISION = f"{CallDecision.REFUSED}:approval_budget"


class Effect(enum.StrEnum):
    """What a tool call does to the world; the safety policy keys on it."""

    READ_ONLY = "read_only"
    REVERSIBLE = "reversible"
    IRREVERSIBLE = "irreversible"


@dataclass(slots=True)
class ToolCall:
    """A tool call requested by the model.

    `parse_error` is set when the model sent arguments that are not a JSON object; the executor
    turns it into an error result the model can correct instead of raising.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=new_dict)
    parse_error: str | None = None
    raw_arguments: str | None = None


@dataclass(slots=True)
class Message:
    """One chat message. `tool_calls` only on assistant messages, `tool_call_id` only on tool."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=new_list)
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: list[ToolCall] | None = None) -> Message:
        return cls("assistant", content, tool_calls or [])


@dataclass(slots=True)
class ToolSpec:
    """What the model is told about a tool: name, description and JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class ToolResult:
    """The outcome of one call as the model will see it (`content` is already capped)."""

    call_id: str
    name: str
    content: str
    is_error: bool = False
    handle: str | None = None  # key of the full result when `content` was capped
    full_chars: int = 0
    decision: str = CallDecision.ALLOWED  # a CallDecision, alone or with :<who or why> (refused:taint)
    # a sub-agent parked on an approval: {"agent", "state"}; recorded with the result, so a replayed
    # durable run knows it without running the tool again (the loop keeps it in RunState.children)
    parked: dict[str, Any] | None = None
    # what the tool knew of this output's origin (`tether.tools.ToolOutput`): None, its declaration decides
    untrusted: bool | None = None
    # a job this result started or delivered (tether.tools._jobs): {"id", "status", ...}; recorded with the
    # result, so a replayed durable run knows which jobs the model has seen without running anything
    job: dict[str, Any] | None = None

    def to_message(self) -> Message:
        return Message("tool", self.content, tool_call_id=self.call_id, name=self.name)


@dataclass(slots=True)
class Usage:
    """Accounting for one model call or a whole run. `input_tokens` includes the cached part:
    `cached_input_tokens` read from a provider's prompt cache, `cache_write_tokens` written to it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    seconds: float = 0.0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost_usd += other.cost_usd
        self.model_calls += other.model_calls
        self.tool_calls += other.tool_calls
        self.seconds += other.seconds
        self.cached_input_tokens += other.cached_input_tokens
        self.cache_write_tokens += other.cache_write_tokens

    def copy(self) -> Usage:
        return dataclasses.replace(self)

    def minus(self, earlier: Usage) -> Usage:
        """What was used since `earlier` (a copy taken from this same running total)."""
        return Usage(*(getattr(self, f.name) - getattr(earlier, f.name) for f in dataclasses.fields(self)))


@dataclass(slots=True)
class OutputSchema:
    """The shape a reply must have (structured output): a JSON Schema whose root is an object.

    An adapter with native structured output renders it (OpenAI `response_format`, Anthropic a
    forced final tool, the embedded model a grammar); `tether._output` does the rest for others.
    """

    name: str
    schema: dict[str, Any]
    description: str = ""
    strict: bool = False  # the schema fits OpenAI's strict mode (all keys required, no extras)


@dataclass(slots=True)
class ModelRequest:
    """Everything a model needs for one completion. `tools` empty means a tool-free call.

    `tool_choice`: None or "auto" (the model decides), "none" (tools are shown but may not be
    called: a tool-free call over a history that holds tool calls), "required" (some tool must be
    called), or a tool name (that tool must be called).
    `output_schema`: the reply must be JSON of this shape (see `OutputSchema`).
    """

    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=new_list)
    max_output_tokens: int | None = None
    temperature: float | None = None
    stop: list[str] = field(default_factory=new_list)
    tool_choice: str | None = None
    output_schema: OutputSchema | None = None


@dataclass(slots=True)
class ModelReply:
    """A model's answer: text, tool calls, or both, with the tokens it used."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=new_list)
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str = ""
    requested: str = ""  # the model asked, when a FallbackModel asked one of its own (priced as asked)

    def to_message(self) -> Message:
        return Message("assistant", self.text, list(self.tool_calls))


@dataclass(slots=True)
class TextDelta:
    """A piece of streamed text. `Model.stream` yields these, then exactly one ModelReply."""

    text: str


@dataclass(slots=True)
class RunResult(Generic[OutputT]):
    """What every run returns, however it ended.

    `output` is the validated object when the agent has an `output_type` (None if no reply
    validated); `answer` is always the text.
    """

    run_id: str
    stop_reason: StopReason
    answer: str
    findings: list[str] = field(default_factory=new_list)
    usage: Usage = field(default_factory=Usage)
    messages: list[Message] = field(default_factory=new_list)
    trace: list[TraceEvent] = field(default_factory=new_list)
    error: str | None = None
    steps: int = 0
    task_state: dict[str, Any] | None = None  # tether.context.TaskState.to_dict(), when the run kept one
    output: OutputT | None = None
    state: RunState | None = None  # everything needed to continue, fork or resume this run

    @property
    def tainted(self) -> bool:
        """Whether the run read untrusted content (its safety policy's view); False without a policy."""
        return self.state is not None and self.state.tainted

    @property
    def completed(self) -> bool:
        return self.stop_reason is StopReason.COMPLETED

    @property
    def events(self) -> list[Event]:
        """The run's events, typed (`tether.events`): the trace's envelopes parsed."""
        return [stored(e) for e in self.trace]

    @property
    def pending(self) -> list[dict[str, Any]]:
        """The calls awaiting a person's decision (call_id, tool, arguments, reason, step)."""
        return self.state.pending if self.state is not None else []

    def approve(self, call_id: str, *, by: str = "library", reason: str = "") -> RunState:
        """Approve a pending call; continue with `agent.run(None, state=result.approve(call_id))`."""
        return self._state().approve(call_id, by=by, reason=reason)

    def deny(self, call_id: str, reason: str = "", *, by: str = "library") -> RunState:
        """Deny a pending call; continue with `agent.run(None, state=result.deny(call_id, why))`."""
        return self._state().deny(call_id, reason, by=by)

    def _state(self) -> RunState:
        if self.state is None:
            raise InvalidInput(f"run {self.run_id!r} carries no state to continue")
        return self.state

    @property
    def usage_by_model(self) -> dict[str, Usage]:
        """Tokens, cost and calls per model that answered (from the trace; see `FallbackModel`)."""
        out: dict[str, Usage] = {}
        for event in self.events:
            if isinstance(event, ModelCallEnded):
                u = out.setdefault(event.model, Usage())
                u.add(Usage(event.input_tokens, event.output_tokens, event.cost_usd, 1))
        return out


NOTE_NAME = "tether"  # the name of a user-role message the loop wrote (the policy's label), not the user's words

RUN_STATE_VERSION = 1


@dataclass(slots=True)
class RunState:
    """Everything one run knows, as JSON-safe data: what a resumed, continued or forked run needs.

    `Agent` holds configuration only; this is the per-run part. `policy` is the safety policy's
    own dump (`policy.dump_state`), `loop_counts`/`loop_warned` the loop detector, `handles` the
    capped results this run may read back, `task_state` the context layer's slot. The loop works
    on live objects and writes them back here when the run stops (not per step).
    """

    run_id: str
    user: str | None = None
    messages: list[Message] = field(default_factory=new_list)
    usage: Usage = field(default_factory=Usage)
    steps: int = 0
    loop_counts: dict[str, int] = field(default_factory=new_dict)
    loop_warned: list[str] = field(default_factory=new_list)
    findings: list[str] = field(default_factory=new_list)
    policy: dict[str, Any] | None = None  # None: the policy has not seen this run yet
    handles: list[str] = field(default_factory=new_list)
    task_state: Any = None
    stop_reason: StopReason | None = None
    version: int = RUN_STATE_VERSION
    pending: list[dict[str, Any]] = field(default_factory=new_list)  # calls awaiting a person's decision
    decisions: list[dict[str, Any]] = field(default_factory=new_list)  # taken, applied when the run continues
    tainted: bool = False  # the run has read untrusted content (the policy's view, as the run last left it)
    # sub-agent runs parked on an approval: the parent's call id -> {"agent": name, "state": the child's
    # RunState as JSON}; its pending calls show in `pending` as "PARENT_CALL/CHILD_CALL"
    children: dict[str, Any] = field(default_factory=new_dict)
    # background jobs (tether.tools._jobs): one dict each: id, tool, arguments, call_id, key (its idempotency
    # key), status (running, done, failed, cancelled, lost), seen (the model was given its result), result
    jobs: list[dict[str, Any]] = field(default_factory=new_list)

    def approve(self, call_id: str, *, by: str = "library", reason: str = "") -> RunState:
        """Approve one pending call; `agent.run(None, state=state)` then runs exactly that call (its
        tool and arguments as asked) and goes on. Returns this state."""
        return self._decide(call_id, True, by, reason)

    def deny(self, call_id: str, reason: str = "", *, by: str = "library") -> RunState:
        """Deny one pending call; when the run continues, the denial (with `reason`) is its answer."""
        return self._decide(call_id, False, by, reason)

    def approve_batch(self, batch: str, *, by: str = "library", reason: str = "") -> RunState:
        """Approve every pending call of a batch (calls one turn announced together, `pending[i]["batch"]`):
        one decision, each call bound to its own tool and arguments."""
        return self._decide_batch(batch, True, by, reason)

    def deny_batch(self, batch: str, reason: str = "", *, by: str = "library") -> RunState:
        """Deny every pending call of a batch."""
        return self._decide_batch(batch, False, by, reason)

    def _decide_batch(self, batch: str, approved: bool, by: str, reason: str) -> RunState:
        calls = [str(p.get("call_id")) for p in self.pending if p.get("batch") == batch]
        if not calls:
            raise InvalidInput(f"no batch {batch!r} awaits a decision in run {self.run_id!r}")
        self._decide(calls[0], approved, by, reason)
        self.decisions[-1]["batch"] = batch
        return self

    def _decide(self, call_id: str, approved: bool, by: str, reason: str) -> RunState:
        if not any(p.get("call_id") == call_id for p in self.pending):
            waiting = ", ".join(str(p.get("call_id")) for p in self.pending) or "none"
            raise InvalidInput(f"no call {call_id!r} awaits a decision in run {self.run_id!r} (waiting: {waiting})")
        if any(d["call_id"] == call_id for d in self.decisions):
            raise InvalidInput(f"call {call_id!r} of run {self.run_id!r} is already decided")
        self.decisions.append({"call_id": call_id, "approved": approved, "by": by, "reason": reason})
        return self

    def to_json(self) -> str:
        return to_json(self)

    @classmethod
    def from_json(cls, data: str | bytes) -> RunState:
        """Parse a dumped state; a state from a newer tether is refused, not misread."""
        state = from_json(cls, data)
        if state.version > RUN_STATE_VERSION:
            raise InvalidInput(f"RunState version {state.version} is newer than this tether understands "
                             f"({RUN_STATE_VERSION})")
        return state


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(tp: Any) -> TypeAdapter[Any]:
    """The TypeAdapter of a type or a generic alias (list[Message]), made once."""
    found = _ADAPTERS.get(tp)
    if found is None:
        found = _ADAPTERS[tp] = TypeAdapter(tp)
    return found


def to_json(obj: Any) -> str:
    """Serialise any tether type (or list of them) to a JSON string."""
    return _adapter(type(obj)).dump_json(obj).decode()


def to_jsonable(obj: Any) -> Any:
    """Serialise to plain Python (dicts, lists, str, numbers)."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


def from_json(tp: type[T], data: str | bytes) -> T:
    """Parse JSON produced by `to_json` back into `tp` (e.g. `from_json(RunResult, s)`)."""
    adapter: TypeAdapter[T] = _adapter(tp)
    return adapter.validate_json(data)


def from_jsonable(tp: type[T], data: Any) -> T:
    adapter: TypeAdapter[T] = _adapter(tp)
    return adapter.validate_python(data)
