"""Plan mode: safety by data flow (CaMeL-style). The privileged model writes a program from the
user's request and the tools' signatures alone; tether interprets it with every value's sources
carried exactly (`tether.values.Label`: integrity and readers, as for hidden values); untrusted text is read only by a quarantined reader; per-argument policies are
checked before every call. See docs/plan-mode.md."""

from tether.plan._agent import PlanAgent
from tether.plan._interp import Interpreter, LimitError, ProgramError
from tether.plan._policies import (
    ALLOW,
    BUILTIN_POLICIES,
    Decision,
    PlanCall,
    PlanPolicy,
    ask,
    confidentiality,
    defang,
    default_policy,
    deny,
    outgoing_text,
    trusted_args,
    user_args,
)
from tether.plan._runner import PlanMode, PlannedCall, PlanResult
from tether.plan._values import EXTRACT, USER, Label, Value, deep_label, plain, tag

__all__ = [
    "ALLOW",
    "BUILTIN_POLICIES",
    "EXTRACT",
    "USER",
    "Decision",
    "Interpreter",
    "Label",
    "LimitError",
    "PlanAgent",
    "PlanCall",
    "PlanMode",
    "PlanPolicy",
    "PlanResult",
    "PlannedCall",
    "ProgramError",
    "Value",
    "ask",
    "confidentiality",
    "deep_label",
    "defang",
    "default_policy",
    "deny",
    "outgoing_text",
    "plain",
    "tag",
    "trusted_args",
    "user_args",
]
