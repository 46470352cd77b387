"""Canonical form of tool arguments: the identity approvals, idempotency and audit bind to."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal arguments give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def action_key(tool: str, arguments: dict[str, Any]) -> str:
    """A hash of the exact action: tool name plus canonical arguments (any change -> new key)."""
    # surrogatepass: a lone surrogate (valid in JSON text, "\\ud800") must not crash the policy
    text = f"{tool}\x00{canonical_json(arguments)}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every scalar inside `value` with its dotted path (`recipients.0`, `meta.amount`)."""
    # isinstance with a tuple of types, not `dict | list`: a union is built anew on every evaluation
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return [(path, value)]
    out: list[tuple[str, Any]] = []
    for k, v in items:
        sub = f"{path}.{k}" if path else str(k)
        if isinstance(v, (dict, list, tuple)):
            out.extend(leaves(v, sub))
        else:  # a scalar: no recursive call for it
            out.append((sub, v))
    return out


def get_path(args: dict[str, Any], path: str) -> tuple[bool, Any]:
    """Look up a dotted path; returns (found, value)."""
    cur: Any = args
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return False, None
    return True, cur
