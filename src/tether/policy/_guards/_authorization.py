"""`AuthorizationGuard`: may the acting user make this call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._types import CallDecision
from tether.policy._authz import check_tool
from tether.policy._capabilities import Capability
from tether.policy._guard import BaseGuard, CallView, Check, Stop
from tether.tools._base import Tool

if TYPE_CHECKING:
    from tether.policy._policy import SafetyPolicy


class AuthorizationGuard(BaseGuard):
    """The policy's `authorizer`, then the capability's own `authorize` rule; a refusal is
    `refused:unauthorized`. Applies only where either is set."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        return self.check if policy.authorizer is not None or cap.authorize is not None else None

    def check(self, c: CallView, /) -> Stop | None:
        """May the acting user make this call (the authorizer, then the capability's own rule)."""
        reason = None
        authorizer = c.policy.authorizer
        if authorizer is not None:
            try:
                reason = authorizer.authorize(c.state.user, c.tool, c.raw_args)
            except Exception as exc:  # a broken authorizer denies
                reason = f"authorization failed ({type(exc).__name__}: {exc}); denied"
        if reason is None and c.cap.authorize is not None:
            reason = check_tool(c.cap.authorize, c.state.user, c.tool, c.raw_args)
        return None if reason is None else Stop(f"{CallDecision.REFUSED}:unauthorized", reason)
