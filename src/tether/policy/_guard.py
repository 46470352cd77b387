"""The guard API: what one safety check sees of a call (`CallView`) and what it may answer.

A guard looks at one call and returns nothing (no objection), a reason to ask a person (a string),
or a `Stop` (refuse, deny, or hold the call for the user). `SafetyPolicy(guards=[...])` runs its
guards in order after choosing the call's capability; the first `Stop` ends the call, and any reason
to ask sends it to the approver. A guard may also narrow itself to the tools it can apply to
(`prepare`): the policy asks once per tool and capability, so a guard that cannot apply costs
nothing per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

from tether._types import Effect, ToolCall
from tether.policy._capabilities import Capability
from tether.policy._provenance import Origin
from tether.policy._state import PolicyState
from tether.tools._base import Tool
from tether.tools._declares import NO_DECLARATIONS, Declares
from tether.tools._executor import CallContext

if TYPE_CHECKING:
    from tether.policy._policy import SafetyPolicy


@dataclass(slots=True)
class Stop:
    """A guard's decision to stop a call: its label, a `tether.CallDecision` with what follows its colon
    (`f"{CallDecision.REFUSED}:<why>"`, `f"{CallDecision.DENIED}:<by>"`, `CallDecision.DEFERRED`), and the
    reason the model is told. `hold`: kept for the user to confirm instead."""

    decision: str
    reason: str
    by: str = ""
    hold: bool = False


@dataclass(slots=True, eq=False)
class CallView:
    """One call as the guards see it; each guard reads what the earlier ones found.

    - `tool`, `call`, `ctx`: the tool, the model's call (id, name) and the run's facts (step, user, bounds).
    - `state`: the run's `PolicyState` (provenance, calls so far, approvals, secrets read).
    - `raw_args`: the arguments as validated (what the tool and an authorizer get); `args`: the same as
      plain JSON values (what every check reads).
    - `policy`: the `SafetyPolicy` deciding (its egress policy, approver, options).
    - `cap`: the tool's capability in this run, `declares` the tool's declarations (both set before
      any guard runs).
    - `effect`: the call's effect class (set by `EffectGuard`; `effect_known` says it was).
    - `trace`: argument path -> where its value came from, `prov` the same as plain strings, `tainted`:
      the run has read untrusted content, `guarded`: the call's effect needs the taint rule (all set
      by `TraceGuard`).
    - `ask`: the reasons found so far for a person to approve the call (empty: no need).
    """

    tool: Tool
    call: ToolCall
    ctx: CallContext
    state: PolicyState
    raw_args: dict[str, Any]
    args: dict[str, Any]
    policy: SafetyPolicy
    cap: Capability = None  # type: ignore[assignment]  # set before the guards run
    declares: Declares = NO_DECLARATIONS  # the tool's declarations (`Tool.declared`), set with `cap`
    effect: Effect = Effect.READ_ONLY  # set by the effect guard (audits before it say "")
    effect_known: bool = False
    trace: dict[str, Origin] = field(default_factory=dict)  # argument path -> where its value came from
    prov: dict[str, str] = field(default_factory=dict)
    tainted: bool = False
    checked_effect: Effect = Effect.READ_ONLY
    guarded: bool = False
    key: str = ""  # the action key of a guarded call
    egress_paths: list[str] = field(default_factory=list)
    ask: list[str] = field(default_factory=list)  # why a person must approve (empty: no need)
    batch: str = ""  # the approval batch that decided it, if any
    arguments: dict[str, Any] | None = None  # the arguments the tool gets instead (a guard rewrote them)


GuardResult: TypeAlias = "Stop | str | None"
"""What a guard answers: None (no objection), a reason to ask a person, or a `Stop`."""

Check: TypeAlias = Callable[[CallView], "Stop | str | None"]


class Guard(Protocol):
    """One safety check of a call. `check` answers None, a reason to ask, or a `Stop`. A guard may
    also define `prepare(policy, tool, cap)` returning the check to run for that tool (None: the guard
    cannot apply to it); the policy calls it once per tool and capability."""

    def check(self, call: CallView, /) -> Stop | str | None: ...


class BaseGuard:
    """A convenient base for guards: `prepare` returns `check` for every tool; override either."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        """The check to run on this tool's calls under `cap`, or None when the guard cannot apply."""
        return self.check

    def check(self, call: CallView, /) -> Stop | str | None:
        return None


def prepared(guard: Guard | Check, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
    """The check a guard (an object with `check`, optionally `prepare`, or a plain function of the
    call) runs on `tool`'s calls, or None when it cannot apply."""
    prepare = getattr(guard, "prepare", None)
    if prepare is not None:
        return cast("Check | None", prepare(policy, tool, cap))
    check = getattr(guard, "check", None)
    return check if check is not None else guard  # type: ignore[return-value]
