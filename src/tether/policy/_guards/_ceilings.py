"""`CeilingGuard`: numeric arguments over the capability's ceilings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._types import CallDecision
from tether.policy._capabilities import Capability
from tether.policy._guard import BaseGuard, CallView, Check, Stop
from tether.tools._base import Tool

if TYPE_CHECKING:
    from tether.policy._policy import SafetyPolicy


class CeilingGuard(BaseGuard):
    """Refuses a call whose argument is over its ceiling (`Capability.ceilings`), or not a finite
    number where a ceiling applies (`refused:ceiling`). Applies only where ceilings are declared."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        return self.check if cap.ceilings else None

    def check(self, c: CallView, /) -> Stop | None:
        over = c.cap.ceiling_violations(c.args)
        return Stop(f"{CallDecision.REFUSED}:ceiling", "; ".join(over)) if over else None
