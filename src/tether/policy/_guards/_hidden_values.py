"""`HiddenValuesGuard`: hidden values passed by handle (tether.values), judged by their labels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._types import CallDecision, Effect
from tether.policy._guard import BaseGuard, CallView, Check, Stop
from tether.policy._guards._taint import _on_untrusted
from tether.policy._provenance import Origin
from tether.values import _decide as hidden
from tether.values._defang import defang
from tether.values._store import Binding

if TYPE_CHECKING:
    from tether.policy._capabilities import Capability
    from tether.policy._policy import SafetyPolicy
    from tether.tools._base import Tool


class HiddenValuesGuard(BaseGuard):
    """The arguments' labels, as substituting hidden values gave them: a secret goes only to a tool
    declared `secret_sink`; an untrusted one in a checked argument (a recipient, an amount, a path, a
    URL) makes an effect a person's decision (or refused, or held, as `Capability.on_untrusted` says)
    even while the model's context is clean. With `SafetyPolicy(payload_labels=True)` (the default),
    untrusted values only in payload arguments (declared `risk_free_args`, or outside `guarded_args`)
    need no question: their texts go with links and host names defanged. Runs after `TraceGuard`;
    only with `SafetyPolicy(hidden_values=True)` (the default)."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        return self.check if policy.hidden_values else self.check_shown

    def check_shown(self, c: CallView, /) -> Stop | None:
        """Text copied from a private output the model was shown (not hidden), sent outside its readers:
        the same rule as for hidden values, by exact substring provenance (tether.values._shown). Only for
        the effects the policy guards (plan mode guards none here: it judges its calls by its own labels)."""
        if not c.state.values.shown or c.checked_effect not in c.policy.guard_effects:
            return None
        user = {p.split(".", 1)[0] for p, o in c.trace.items() if o is Origin.USER}
        user -= {p.split(".", 1)[0] for p, o in c.trace.items() if o is not Origin.USER}
        leak = hidden.shown_leak(c.state.values, c.tool, c.args, user,
                                 lambda names: bool(names) and set(names) <= user)
        if leak is None:
            return None
        if c.declares.on_leak == "refuse":
            return Stop(f"{CallDecision.REFUSED}:confidential", leak)
        c.ask.append(leak)
        return None

    def check(self, c: CallView, /) -> Stop | None:
        values = c.state.values
        if values.shown and (stop := self.check_shown(c)) is not None:  # (nothing shown: no frame for it)
            return stop
        binding = values.bindings.get(c.call.id)
        if binding is None or not binding.used:
            return None
        c.prov.update(hidden.argument_origins(binding))
        if (why := hidden.sink_refusal(c.tool, binding)) is not None:
            return Stop(f"{CallDecision.REFUSED}:secret", why)
        if (leak := hidden.leak_reason(c.tool, binding, c.args)) is not None:  # by readers, both modes' rule
            if c.declares.on_leak == "refuse":
                return Stop(f"{CallDecision.REFUSED}:confidential", binding.mask(leak))
            c.ask.append(leak)
        why = hidden.untrusted_reason(binding)
        # an undeclared effect is checked as reversible (fail closed), as after taint
        effect = c.effect if c.tool.effect_declared or c.cap.effect is not None else Effect.REVERSIBLE
        if why is None or effect not in c.policy.guard_effects or c.declares.staged:
            return None
        c.guarded = True
        # a capability that refuses or holds untrusted effects keeps doing so for payload too
        if c.policy.payload_labels and c.cap.on_untrusted == "approve" and _payload_only(c, binding):
            return None
        return _on_untrusted(c, why)


def _payload_only(c: CallView, binding: Binding) -> bool:
    """Whether every untrusted value is in a payload argument, with the texts there defanged (the call's
    arguments replaced): the recipient, amount, path and URL are the user's or a trusted source's, so
    what the attacker wrote can only be read by a person the user chose (docs/hidden_values.md)."""
    risk_free = c.cap.risk_free_args if c.cap.risk_free_args is not None else c.declares.risk_free_args
    guarded = c.cap.guarded_args if c.cap.guarded_args is not None else c.declares.guarded_args
    payload = hidden.payload_args(c.tool, risk_free, guarded, c.args)
    if not payload or hidden.checked_untrusted(binding, payload):
        return False
    raw = hidden.defang_payload(c.raw_args, binding)
    plain = hidden.defang_payload(c.args, binding)
    if raw is None or plain is None:
        return False  # a value that is not plain JSON cannot be defanged: a person decides
    c.raw_args, c.arguments = raw[0], raw[0]
    c.args = plain[0]
    # the texts as sent: seen again in an output, they taint as the originals would (note_sent)
    binding.values.extend(d for v in list(binding.values) if (d := defang(v)) != v)
    for path in plain[1]:
        c.prov[path] = c.prov.get(path, "") + " (links and host names defanged)"
    return True
