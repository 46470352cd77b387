"""`PolicyState`: everything the safety policy knows about one run, owned by the run.

The loop keeps it on `CallContext.policy_state` and dumps it into the run's RunState
(`SafetyPolicy.dump_state` / `load_state`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired

from typing_extensions import TypedDict

from tether.policy._provenance import Provenance
from tether.policy._serial import Codec, dump_state, load_state
from tether.values._store import ValueStore

STATE_VERSION = 1


class Awaiting(TypedDict):
    """An approval asked out of process, waiting for `SafetyPolicy.decide`."""

    tool: str
    arguments: dict[str, Any]
    key: str  # the action key the decision binds to
    reason: str
    provenance: NotRequired[dict[str, str]]
    batch: NotRequired[str]  # the approval batch it was asked in, if any
    batch_summary: NotRequired[str]


class Decided(TypedDict):
    """A decision recorded by `SafetyPolicy.decide`, bound to one action key, used once."""

    approved: bool
    by: str
    reason: str
    call_id: NotRequired[str]
    batch: NotRequired[str]  # the approval batch it was decided with, if any


@dataclass
class _Pending:
    """A call let through by `before_call`, waiting for its result in `after_call`."""

    args: dict[str, Any]
    provenance: dict[str, str]
    effect: str
    decision: str
    by: str
    reason: str
    step: int
    written: list[Any] = field(default_factory=list[Any])  # values to record as untrusted once it ran
    batch: str = ""  # the approval batch that decided it, if any


def _load_values(data: Any) -> ValueStore:
    return data if isinstance(data, ValueStore) else ValueStore.load(data)


def _load_prov(data: Any) -> Provenance:
    return data if isinstance(data, Provenance) else Provenance.load(data or {})


# field types with a JSON form of their own (see tether.policy._serial)
ProvenanceField = Annotated[Provenance, *Codec(Provenance.dump, _load_prov)]
ValuesField = Annotated[ValueStore, *Codec(ValueStore.dump, _load_values)]
Names = Annotated[set[str], *Codec(sorted, lambda v: {str(x) for x in v})]  # dumped sorted: equal states, equal JSON
Secrets = Annotated[dict[str, str], *Codec(lambda d: dict(sorted(d.items())), lambda v: _load_secrets(v))]


@dataclass
class PolicyState:
    """Everything the policy knows about one run. The run owns it (`CallContext.policy_state`);
    `dump`/`load` (`SafetyPolicy.dump_state`/`load_state`) turn it into JSON and back, generated
    from the fields below (tether.policy._serial): a new field needs no codec."""

    run_id: str
    user: str | None
    prov: ProvenanceField = field(default_factory=Provenance)
    calls: Counter[str] = field(default_factory=Counter[str])
    held: list[str] = field(default_factory=list[str])  # actions replaced by a summary for the user
    pending: dict[str, _Pending] = field(default_factory=dict[str, _Pending])  # in flight: call id -> what was decided
    approved: Names = field(default_factory=set[str])  # action keys approved in this run
    done: Names = field(default_factory=set[str])  # action keys with an effect let through in this run
    trusted_handles: Names = field(default_factory=set[str])  # read_result handles of trusted outputs
    has_prompt: bool = False
    # approvals asked out of process: call id -> what was asked
    awaiting: dict[str, Awaiting] = field(default_factory=dict[str, Awaiting])
    # decisions recorded by `decide`, bound to one action key, used once
    decisions: dict[str, Decided] = field(default_factory=dict[str, Decided])
    written_paths: Names = field(default_factory=set[str])  # files written after taint from others' content
    labels: dict[str, str] = field(default_factory=dict[str, str])  # call id -> tool, untrusted results of this turn
    # secret values the run's tool results held -> where they were read (".env", a tool's name)
    secrets: Secrets = field(default_factory=dict[str, str])
    asked: int = 0  # approvals asked of a person or an approver in this run
    denied: int = 0  # of them, denied
    values: ValuesField = field(default_factory=ValueStore)  # hidden values (tether.values), by handle
    counted_batches: Names = field(default_factory=set[str])  # batch ids the approval budget has counted
    # calls of the current turn asked about together: call id -> {"batch": id, "batch_summary": text}
    batched: dict[str, dict[str, str]] = field(default_factory=dict[str, dict[str, str]])

    @property
    def tainted(self) -> bool:
        return self.prov.tainted

    def dump(self) -> dict[str, Any]:
        """JSON-safe data, versioned (`STATE_VERSION`)."""
        return dump_state(self, STATE_VERSION)

    @classmethod
    def load(cls, data: dict[str, Any]) -> PolicyState:
        """A state from `dump` output; behaves exactly as the dumped one."""
        return load_state(cls, data, STATE_VERSION)


def _load_secrets(data: Any) -> dict[str, str]:
    if isinstance(data, dict):
        return {str(k): str(v) for k, v in data.items()}
    return dict.fromkeys((str(v) for v in data or ()), "a tool's output")  # states before sources were kept
