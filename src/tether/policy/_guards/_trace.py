"""`TraceGuard`: where every argument value came from, for the guards after it (not a check)."""

from __future__ import annotations

from tether._types import Effect
from tether.policy._guard import BaseGuard, CallView


class TraceGuard(BaseGuard):
    """Sets `CallView.trace`, `prov`, `tainted`, `checked_effect` and `guarded`; never objects. The
    guards after it (egress, argument scan, provenance, taint) read what it sets: keep it before them."""

    def check(self, c: CallView, /) -> None:
        """Not a check: what the remaining guards read (where every argument value came from, the taint)."""
        c.trace = c.state.prov.trace(c.args)
        c.prov = {p: o._value_ for p, o in c.trace.items()}  # _value_: the plain str, without enum's descriptor
        c.tainted = c.state.prov._tainted  # (`Provenance.tainted`, without its property frame)
        # a tool that did not declare its effect is checked like a reversible one (fail closed)
        c.checked_effect = c.effect if not c.tainted or c.tool.effect_declared or c.cap.effect is not None \
            else Effect.REVERSIBLE
        # a staged effect lands in the run's staged view (tether.staging), reviewed before it reaches the
        # workspace: reversible by construction, so nothing to ask about here
        c.guarded = c.checked_effect in c.policy.guard_effects and not c.declares.staged
