"""`PolicyState`: everything the safety policy knows about one run, owned by the run.

The loop keeps it on `CallContext.policy_state` and dumps it into the run's RunState
(`SafetyPolicy.dump_state` / `load_state`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tether._errors import InvalidInput
from tether.policy._provenance import Provenance

STATE_VERSION = 1


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
    written: list[Any] = field(default_factory=list)  # values to record as untrusted once it ran


@dataclass
class PolicyState:
    """Everything the policy knows about one run. The run owns it (`CallContext.policy_state`);
    `SafetyPolicy.dump_state`/`load_state` turn it into JSON and back."""

    run_id: str
    user: str | None
    prov: Provenance = field(default_factory=Provenance)
    calls: Counter[str] = field(default_factory=Counter)
    held: list[str] = field(default_factory=list)  # actions replaced by a summary for the user
    pending: dict[str, _Pending] = field(default_factory=dict)  # in flight: call id -> what was decided
    approved: set[str] = field(default_factory=set)  # action keys approved in this run
    done: set[str] = field(default_factory=set)  # action keys with an effect let through in this run
    trusted_handles: set[str] = field(default_factory=set)  # read_result handles of trusted outputs
    has_prompt: bool = False
    # approvals asked out of process: call id -> {"tool", "arguments", "key", "reason"}
    awaiting: dict[str, dict[str, Any]] = field(default_factory=dict)
    # decisions recorded by `decide`, bound to one action key, used once: key -> {"approved", "by", "reason"}
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    written_paths: set[str] = field(default_factory=set)  # files written after taint from others' content
    labels: dict[str, str] = field(default_factory=dict)  # call id -> tool, untrusted results of this turn
    # secret values the run's tool results held -> where they were read (".env", a tool's name)
    secrets: dict[str, str] = field(default_factory=dict)
    asked: int = 0  # approvals asked of a person or an approver in this run
    denied: int = 0  # of them, denied

    @property
    def tainted(self) -> bool:
        return self.prov.tainted

    def dump(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION, "run_id": self.run_id, "user": self.user, "prov": self.prov.dump(),
            "calls": dict(self.calls), "held": list(self.held),
            "pending": {k: vars(p).copy() for k, p in self.pending.items()},
            "approved": sorted(self.approved), "done": sorted(self.done), "trusted_handles": sorted(self.trusted_handles),
            "has_prompt": self.has_prompt, "awaiting": dict(self.awaiting), "decisions": dict(self.decisions),
            "written_paths": sorted(self.written_paths), "labels": dict(self.labels),
            "secrets": dict(sorted(self.secrets.items())), "asked": self.asked, "denied": self.denied,
        }

    @classmethod
    def load(cls, data: dict[str, Any]) -> PolicyState:
        version = data.get("version") if isinstance(data, dict) else None
        if version != STATE_VERSION:
            raise InvalidInput(f"policy state version {version!r} is not supported (expected {STATE_VERSION})")
        return cls(
            run_id=str(data["run_id"]), user=data.get("user"), prov=Provenance.load(data.get("prov") or {}),
            calls=Counter({str(k): int(v) for k, v in dict(data.get("calls", {})).items()}),
            held=[str(h) for h in data.get("held", ())],
            pending={str(k): _Pending(**v) for k, v in dict(data.get("pending", {})).items()},
            approved={str(k) for k in data.get("approved", ())},
            done={str(k) for k in data.get("done", ())},
            trusted_handles={str(h) for h in data.get("trusted_handles", ())},
            has_prompt=bool(data.get("has_prompt")),
            awaiting={str(k): dict(v) for k, v in dict(data.get("awaiting", {})).items()},
            decisions={str(k): dict(v) for k, v in dict(data.get("decisions", {})).items()},
            written_paths={str(p) for p in data.get("written_paths", ())},
            labels={str(k): str(v) for k, v in dict(data.get("labels", {})).items()},
            secrets=_load_secrets(data.get("secrets")),
            asked=int(data.get("asked", 0)), denied=int(data.get("denied", 0)),
        )


def _load_secrets(data: Any) -> dict[str, str]:
    if isinstance(data, dict):
        return {str(k): str(v) for k, v in data.items()}
    return dict.fromkeys((str(v) for v in data or ()), "a tool's output")  # states before sources were kept
