"""`EffectGuard`: the call's effect class, which may depend on its arguments."""

from __future__ import annotations

from tether._types import CallDecision, Effect
from tether.policy._guard import BaseGuard, CallView, Stop


class EffectGuard(BaseGuard):
    """Sets `CallView.effect` from the capability (a function of the arguments, or the tool's own);
    a classifier that fails refuses the call (`refused:effect`)."""

    def check(self, c: CallView, /) -> Stop | None:
        """The call's effect class (it may depend on the arguments)."""
        spec = c.cap.effect if c.cap.effect is not None else c.tool.effect
        if isinstance(spec, Effect):  # `effect_for`'s usual case, without its frame
            c.effect, c.effect_known = spec, True
            return None
        try:
            c.effect, c.effect_known = c.cap.effect_for(c.tool, c.raw_args), True
        except Exception as exc:
            return Stop(f"{CallDecision.REFUSED}:effect", f"could not classify the call's effect ({type(exc).__name__}: {exc})")
        return None
