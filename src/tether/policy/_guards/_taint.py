"""`TaintGuard`: the taint rule. After the run read untrusted content, an effect is a person's call."""

from __future__ import annotations

from typing import Any

from tether._types import CallDecision
from tether.policy._canonical import leaves
from tether.policy._capabilities import Capability
from tether.policy._guard import BaseGuard, CallView, Stop
from tether.policy._provenance import SAFE_ORIGINS, Origin, is_money, words
from tether.tools._base import Tool

FREE_TEXT_WORDS = 3  # a risk-free argument's value of fewer words (a date, an id) is checked anyway

_PLAIN_ORIGIN = {"user": "your request", "trusted": "a trusted tool", "untrusted": "text you did not write",
                 "model": "written by the model", "neutral": "nothing in particular"}


class TaintGuard(BaseGuard):
    """A guarded call (an effect in `SafetyPolicy.guard_effects`) after the run read untrusted
    content needs a person's approval, or is refused or held, as `Capability.on_untrusted` says. With
    `use_provenance=True`, only a call whose checked arguments are not all from the user's request."""

    def check(self, c: CallView, /) -> Stop | None:
        """The taint rule: after the run read untrusted content, an effect's checked arguments must
        come from the user's request (else: refuse, hold for the user, or ask, as declared)."""
        if not (c.guarded and c.tainted):
            return None
        sources = ", ".join(c.state.prov.taint_sources)
        if not c.policy.use_provenance:
            # the default: every effect after taint is a person's decision (or refused, or held, as the
            # capability says); where the values seem to come from is shown, never a reason to skip
            why = (f"this run has read untrusted content ({sources}): text you did not write, which could have "
                   "chosen this action")
            if c.prov:
                why += "; a guess at where each value came from (by matching text, not proof): " + ", ".join(
                    f"{path or 'value'}: {_PLAIN_ORIGIN.get(origin, origin)}" for path, origin in c.prov.items())
            return _on_untrusted(c, why)
        exempt = _risk_free(c.tool, c.cap, c.trace)
        risky = _risky(c.trace, exempt, c.args)
        if not risky and c.policy.user_anchor and _unanchored(c.trace, exempt):
            # every value is traceable, but only to tool outputs: which action to take with them was
            # decided after the run read untrusted content
            c.ask.append(f"the run has read untrusted content ({sources}) and no argument is from the "
                         "user's request (the action was chosen after)")
        if risky:
            return _on_untrusted(c, f"the run has read untrusted content ({sources}) and these arguments are "
                                    f"not from the user's request: {', '.join(risky)}")
        return None


def _on_untrusted(c: CallView, why: str) -> Stop | None:
    """What the capability says to do with an effect the taint rule caught: refuse, hold for the
    user, or ask (the default)."""
    if c.cap.on_untrusted == "refuse":
        return Stop(f"{CallDecision.REFUSED}:taint", why)
    if c.cap.on_untrusted == "summarize":
        return Stop(CallDecision.DEFERRED, why, hold=True)
    c.ask.append(why)
    return None


def _risk_free(tool: Tool, cap: Capability, trace: dict[str, Origin]) -> frozenset[str]:
    """Top-level arguments exempt from the origin check after taint (payload the user asked to be
    derived from what was read). Declared by `risk_free_args`, or as the complement of the legacy
    `guarded_args`; none when undeclared. When a call carries nothing in its checked arguments (a
    calendar event with no participants), every argument is checked."""
    risk_free = cap.risk_free_args if cap.risk_free_args is not None else tool.declared.risk_free_args
    if risk_free is not None:
        exempt = frozenset(risk_free)
    elif cap.guarded_args is not None:
        exempt = frozenset(p.split(".", 1)[0] for p in trace) - frozenset(cap.guarded_args)
    else:
        return frozenset()
    if not any(o is not Origin.NEUTRAL for p, o in trace.items() if p.split(".", 1)[0] not in exempt):
        return frozenset()
    return exempt


def _unanchored(trace: dict[str, Origin], exempt: frozenset[str]) -> bool:
    """No checked argument holds a value from the user's request. None at all counts: an effect with
    nothing to check (`wipe_database()`, `purge_all(confirm=True)`) was chosen after the run read
    untrusted content as much as one whose values came from it."""
    checked = [o for p, o in trace.items() if p.split(".", 1)[0] not in exempt and o is not Origin.NEUTRAL]
    return Origin.USER not in checked


def _risky(trace: dict[str, Origin], exempt: frozenset[str], args: dict[str, Any]) -> list[str]:
    """Checked arguments not traceable to the user: untrusted or model-written values, and amounts
    of money read from a tool (the decision to send them came after taint). A risk-free argument
    is exempt only for free text: a short value in it (a date, an id, a number, a name) is checked."""
    out: list[str] = []
    values = dict(leaves(args))
    for path, origin in trace.items():
        if path.split(".", 1)[0] in exempt:
            value = values.get(path)
            if origin in SAFE_ORIGINS or (isinstance(value, str) and len(words(value)) >= FREE_TEXT_WORDS):
                continue
            out.append(f"{path} ({origin.value}; too short to be free text)")
            continue
        if origin not in SAFE_ORIGINS:
            out.append(f"{path or 'value'} ({origin.value})")
        elif origin is Origin.TRUSTED and is_money(path):
            out.append(f"{path} (an amount read from a tool, not given by the user)")
    return out
