"""Usage and cost of stored runs, grouped by day, agent, model, tool or run (`tether runs stats`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from typing import Any

from tether._errors import InvalidInput
from tether._types import CallDecision
from tether.store._sql import RunStore

GROUPS = ("day", "agent", "model", "tool", "run")


@dataclass(slots=True)
class UsageRow:
    """One group's totals. Model and tool groups count what their calls' events say; day, agent and
    run groups what the runs' usage says (cached input tokens are known only there)."""

    key: str
    runs: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    tool_calls: int = 0
    tool_errors: int = 0

    def add_call(self, event: dict[str, Any]) -> None:
        """Count one model_call event's payload."""
        self.model_calls += 1
        self.input_tokens += int(event.get("input_tokens", 0))
        self.output_tokens += int(event.get("output_tokens", 0))
        self.cost_usd += float(event.get("cost_usd", 0.0))

    def add(self, other: UsageRow) -> None:
        """Add `other`'s counts (its key aside)."""
        for f in fields(self)[1:]:
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def usage_stats(store: RunStore, by: str = "day", *, since: float | None = None,
                user: str | None = None) -> list[UsageRow]:
    """Totals per group of the runs created at `since` or later (all when None), `user`'s only when
    given; the most expensive group first (then by key)."""
    if by not in GROUPS:
        raise InvalidInput(f"cannot group by {by!r}; use one of: {', '.join(GROUPS)}")
    where = ["created_at >= :s"]
    params: dict[str, Any] = {"s": since if since is not None else 0.0}
    if user is not None:
        where.append("user_id = :u")
        params["u"] = user
    clause = " AND ".join(where)
    rows: dict[str, UsageRow] = {}
    if by in ("day", "agent", "run"):
        errors = _tool_errors(store, clause, params)
        for run_id, agent, created, usage in store._rows(
                f"SELECT run_id, agent, created_at, usage FROM tether_runs WHERE {clause}", params):
            key = {"day": time.strftime("%Y-%m-%d", time.gmtime(created)), "agent": agent, "run": run_id}[by]
            u = _json(usage)
            rows.setdefault(key, UsageRow(key)).add(UsageRow(
                key, runs=1, model_calls=int(u.get("model_calls", 0)), input_tokens=int(u.get("input_tokens", 0)),
                cached_input_tokens=int(u.get("cached_input_tokens", 0)), output_tokens=int(u.get("output_tokens", 0)),
                cost_usd=float(u.get("cost_usd", 0.0)), tool_calls=int(u.get("tool_calls", 0)),
                tool_errors=errors.get(run_id, 0)))
    else:
        kind = "model_call" if by == "model" else "tool_call"
        seen: dict[str, set[str]] = {}
        for run_id, data in store._rows(
                f"SELECT run_id, data FROM tether_events WHERE kind = :k AND run_id IN "
                f"(SELECT run_id FROM tether_runs WHERE {clause})", {**params, "k": kind}):
            d = _json(data)
            key = str(d.get("model" if by == "model" else "name") or "?")
            row = rows.setdefault(key, UsageRow(key))
            seen.setdefault(key, set()).add(run_id)
            if by == "model":
                row.add_call(d)
            elif d.get("decision") != CallDecision.AWAITING_APPROVAL:  # a parked call has not run (yet)
                row.tool_calls += 1
                row.tool_errors += _failed(d)
        for key, runs in seen.items():
            rows[key].runs = len(runs)
    return sorted(rows.values(), key=lambda r: (-r.cost_usd, -(r.input_tokens + r.output_tokens), r.key))


def _tool_errors(store: RunStore, clause: str, params: dict[str, Any]) -> dict[str, int]:
    """Failed tool calls per run of those `clause` selects: a run's usage counts its tool calls but not
    their errors, which only its tool_call events record."""
    out: dict[str, int] = {}
    for run_id, data in store._rows(
            f"SELECT run_id, data FROM tether_events WHERE kind = 'tool_call' AND run_id IN "
            f"(SELECT run_id FROM tether_runs WHERE {clause})", params):
        if _failed(_json(data)):
            out[run_id] = out.get(run_id, 0) + 1
    return out


def _failed(event: dict[str, Any]) -> bool:
    """Whether a tool_call event records a call that ran and failed (a parked call has not run yet)."""
    return event.get("decision") != CallDecision.AWAITING_APPROVAL and bool(event.get("is_error"))


def run_totals(store: RunStore, run_id: str, through: int | None = None) -> UsageRow:
    """One run's model calls, tokens and cost so far, from its stored model_call events (those at seq
    `through` or before, when given): what a running run has spent before its row is written."""
    row = UsageRow(run_id, runs=1)
    sql = "SELECT data FROM tether_events WHERE run_id = :r AND kind = 'model_call'"
    params: dict[str, Any] = {"r": run_id}
    if through is not None:
        sql += " AND seq <= :s"
        params["s"] = through
    for (data,) in store._rows(sql, params):
        row.add_call(_json(data))
    return row


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        out = json.loads(value) if value else {}
    except (TypeError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}
