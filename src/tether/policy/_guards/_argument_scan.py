"""`ArgumentScanGuard`: secrets and exfiltration links in arguments the user did not write."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._types import CallDecision, Effect
from tether.policy._canonical import leaves
from tether.policy._capabilities import Capability
from tether.policy._guard import BaseGuard, CallView, Check, Stop
from tether.policy._leaks import find_leaks
from tether.policy._output_filter import scan
from tether.policy._provenance import Origin
from tether.tools._base import Tool

if TYPE_CHECKING:
    from tether.policy._policy import SafetyPolicy


class ArgumentScanGuard(BaseGuard):
    """A secret value the run read (or the environment holds) in an argument is refused
    (`refused:secret`); a suspicious link asks. Only for calls with an effect or a URL argument, and
    only with `SafetyPolicy(scan_arguments=True)` (the default)."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        return self.check if policy.scan_arguments else None

    def check(self, c: CallView, /) -> Stop | None:
        """Secrets and exfiltration links in arguments the user did not write."""
        policy = c.policy
        if not policy.scan_arguments or (c.checked_effect is Effect.READ_ONLY and not c.egress_paths):
            return None
        d = c.declares
        # a workspace file tool may write a value read from the workspace back into it (it is there
        # already); a tool declared `secret_sink` takes secrets by design (a login)
        secrets = {} if d.writes_path or d.secret_sink else policy.secrets_of(c.state)
        for path, value in leaves(c.args):
            if not isinstance(value, str) or c.trace.get(path) is Origin.USER:
                continue
            if secrets and (leaks := find_leaks(value, secrets)):
                return Stop(f"{CallDecision.REFUSED}:secret", f"argument '{path}' carries a secret value read from "
                                              f"{leaks[0].source} ({leaks[0].how}); secrets must not leave the run")
            for _, _, f in scan(value, egress=policy.egress):
                if f.kind == "secret":
                    return Stop(f"{CallDecision.REFUSED}:secret", f"argument '{path}' {f.reason}")
                c.ask.append(f"argument '{path}': {f.reason}")
        return None
