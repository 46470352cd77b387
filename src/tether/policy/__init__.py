"""Safety by design: capabilities, taint and provenance, approvals, authorization, idempotency,
egress and output filtering, audit, and a response safety filter. Everything is enforced inside
the executor through `SafetyPolicy` (the executor's Policy seam), whose checks are guards
(`Guard`, `default_guards()`): write your own and pass `SafetyPolicy(guards=[...])`."""

from tether.policy._approvals import (
    AllowRule,
    ApprovalBatch,
    ApprovalBook,
    ApprovalDecision,
    ApprovalRequest,
    Approver,
    AutoApprove,
    CallbackApprover,
    DenyAll,
    OracleApprover,
    PendingApprover,
    RuleApprover,
    TerminalApprover,
)
from tether.policy._audit import AuditLog, AuditRecord, JsonlSink, SqliteSink
from tether.policy._authz import Authorizer, Permissions
from tether.policy._canonical import action_key, canonical_json
from tether.policy._capabilities import Capabilities, Capability
from tether.policy._egress import EgressPolicy
from tether.policy._guard import BaseGuard, CallView, Guard, GuardResult, Stop
from tether.policy._guards import (
    ArgumentScanGuard,
    AuthorizationGuard,
    CeilingGuard,
    DeclarationGuard,
    EffectGuard,
    EgressGuard,
    HiddenValuesGuard,
    ProvenanceGuard,
    RateGuard,
    TaintGuard,
    TraceGuard,
    default_guards,
)
from tether.policy._idempotency import IdempotencyCache, MemoryIdempotency, idempotent
from tether.policy._output_filter import Finding, filter_output
from tether.policy._policy import SafetyPolicy, wrap_untrusted
from tether.policy._provenance import Origin, Provenance
from tether.policy._safety_filter import (
    INPUT_RULES,
    OUTPUT_RULES,
    Rule,
    RuleResult,
    SafetyFilter,
    SafetyVerdict,
    VerdictCache,
    as_filter,
    input_filter,
    output_filter,
    phrase_rule,
)
from tether.policy._state import PolicyState

__all__ = [
    "INPUT_RULES",
    "OUTPUT_RULES",
    "AllowRule",
    "ApprovalBatch",
    "ApprovalBook",
    "ApprovalDecision",
    "ApprovalRequest",
    "Approver",
    "ArgumentScanGuard",
    "AuditLog",
    "AuditRecord",
    "AuthorizationGuard",
    "Authorizer",
    "AutoApprove",
    "BaseGuard",
    "CallView",
    "CallbackApprover",
    "Capabilities",
    "Capability",
    "CeilingGuard",
    "DeclarationGuard",
    "DenyAll",
    "EffectGuard",
    "EgressGuard",
    "EgressPolicy",
    "Finding",
    "Guard",
    "GuardResult",
    "HiddenValuesGuard",
    "IdempotencyCache",
    "JsonlSink",
    "MemoryIdempotency",
    "OracleApprover",
    "Origin",
    "PendingApprover",
    "Permissions",
    "PolicyState",
    "Provenance",
    "ProvenanceGuard",
    "RateGuard",
    "Rule",
    "RuleApprover",
    "RuleResult",
    "SafetyFilter",
    "SafetyPolicy",
    "SafetyVerdict",
    "SqliteSink",
    "Stop",
    "TaintGuard",
    "TerminalApprover",
    "TraceGuard",
    "VerdictCache",
    "action_key",
    "as_filter",
    "canonical_json",
    "default_guards",
    "filter_output",
    "idempotent",
    "input_filter",
    "output_filter",
    "phrase_rule",
    "wrap_untrusted",
]
