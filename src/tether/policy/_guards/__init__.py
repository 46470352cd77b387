"""The safety policy's guards, one job each, in the order `SafetyPolicy` runs them by default."""

from __future__ import annotations

from tether.policy._guard import Guard
from tether.policy._guards._argument_scan import ArgumentScanGuard
from tether.policy._guards._authorization import AuthorizationGuard
from tether.policy._guards._ceilings import CeilingGuard
from tether.policy._guards._declarations import DeclarationGuard
from tether.policy._guards._effect import EffectGuard
from tether.policy._guards._egress import EgressGuard
from tether.policy._guards._hidden_values import HiddenValuesGuard
from tether.policy._guards._provenance import ProvenanceGuard
from tether.policy._guards._rate import RateGuard
from tether.policy._guards._taint import TaintGuard
from tether.policy._guards._trace import TraceGuard

__all__ = [
    "ArgumentScanGuard",
    "AuthorizationGuard",
    "CeilingGuard",
    "DeclarationGuard",
    "EffectGuard",
    "EgressGuard",
    "HiddenValuesGuard",
    "ProvenanceGuard",
    "RateGuard",
    "TaintGuard",
    "TraceGuard",
    "default_guards",
]


def default_guards() -> list[Guard]:
    """The guards of `SafetyPolicy()`, in order: authorization -> effect class -> ceilings -> rate
    limits -> declarations -> trace (where values came from) -> hidden values (their labels) -> egress
    -> argument scan -> provenance -> taint. Insert a guard of your own where it belongs (after `TraceGuard` to read `trace`), remove
    or replace one, and pass the list as `SafetyPolicy(guards=...)`."""
    return [AuthorizationGuard(), EffectGuard(), CeilingGuard(), RateGuard(), DeclarationGuard(), TraceGuard(),
            HiddenValuesGuard(), EgressGuard(), ArgumentScanGuard(), ProvenanceGuard(), TaintGuard()]
