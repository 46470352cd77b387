"""`RateGuard`: most calls of a tool per run and per user."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._types import CallDecision
from tether.policy._capabilities import Capability
from tether.policy._guard import BaseGuard, CallView, Check, Stop
from tether.policy._state import PolicyState
from tether.tools._base import Tool

if TYPE_CHECKING:
    from tether.policy._policy import SafetyPolicy


class RateGuard(BaseGuard):
    """Refuses a call over `Capability.per_run` (calls in this run) or `per_user` (calls by this user
    within `per_user_window` seconds, across runs of the policy): `refused:rate_limit`. The call is
    counted when it is let through (the policy's approval step)."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        return self.check if cap.per_run is not None or cap.per_user is not None else None

    def check(self, c: CallView, /) -> Stop | None:
        limited = rate_limited(c.policy, c.state, c.cap, c.tool)
        return Stop(f"{CallDecision.REFUSED}:rate_limit", limited) if limited else None


def rate_limited(policy: SafetyPolicy, state: PolicyState, cap: Capability, tool: Tool) -> str | None:
    if cap.per_run is not None and state.calls[tool.name] >= cap.per_run:
        return f"'{tool.name}' may run at most {cap.per_run} time(s) per run"
    if cap.per_user is not None:
        stamps = policy._per_user.get((state.user, tool.name))  # pyright: ignore[reportPrivateUsage]
        if stamps is not None:
            cutoff = policy.clock() - cap.per_user_window
            while stamps and stamps[0] <= cutoff:
                stamps.popleft()
            if len(stamps) >= cap.per_user:
                return (f"'{tool.name}' may run at most {cap.per_user} time(s) per "
                        f"{cap.per_user_window:g} s for this user")
    return None
