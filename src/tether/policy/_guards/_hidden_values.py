"""`HiddenValuesGuard`: hidden values passed by handle (tether.values), judged by their labels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._types import Effect
from tether.policy._guard import BaseGuard, CallView, Check, Stop
from tether.policy._guards._taint import _on_untrusted
from tether.values import _decide as hidden

if TYPE_CHECKING:
    from tether.policy._capabilities import Capability
    from tether.policy._policy import SafetyPolicy
    from tether.tools._base import Tool


class HiddenValuesGuard(BaseGuard):
    """The arguments' labels, as substituting hidden values gave them: a secret goes only to a tool
    declared `secret_sink`; an untrusted one makes an effect a person's decision (or refused, or held,
    as `Capability.on_untrusted` says) even while the model's context is clean. Runs after `TraceGuard`;
    only with `SafetyPolicy(hidden_values=True)` (the default)."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        return self.check if policy.hidden_values else None

    def check(self, c: CallView, /) -> Stop | None:
        binding = c.state.values.binding(c.call.id)
        if binding is None or not binding.used:
            return None
        c.prov.update(hidden.argument_origins(binding))
        if (why := hidden.sink_refusal(c.tool, binding)) is not None:
            return Stop("refused:secret", why)
        why = hidden.untrusted_reason(binding)
        # an undeclared effect is checked as reversible (fail closed), as after taint
        effect = c.effect if c.tool.effect_declared or c.cap.effect is not None else Effect.REVERSIBLE
        if why is None or effect not in c.policy.guard_effects or c.declares.staged:
            return None
        c.guarded = True
        return _on_untrusted(c, why)
