"""Plan policies the AgentDojo plan-mode suites share."""

from __future__ import annotations

from tether.plan import ALLOW, Decision, PlanCall, PlanPolicy, ask, plain
from tether.policy._egress import find_urls


def no_untrusted_links(*names: str) -> PlanPolicy:
    """A payload may be derived from what was read, but a link in it must then be the user's: an
    untrusted value holding a URL asks (phishing, exfiltration by query string)."""
    def check(call: PlanCall) -> Decision:
        for n in names:
            v = call.args.get(n)
            if v is not None and not call.is_trusted(n) and find_urls(str(plain(v))):
                return ask(f"{n} holds a link and comes from {call.untrusted()}")
        return ALLOW
    return check


def both(*policies: PlanPolicy) -> PlanPolicy:
    """Every policy must allow; the first that does not decides."""
    def check(call: PlanCall) -> Decision:
        for p in policies:
            d = p(call)
            if d.action != "allow":
                return d
        return ALLOW
    return check
