"""The on-call assistant's tools, over the fixtures in fixtures/.

Read-only tools shape their output (top matching lines with timestamps and counts, metric
summaries), never raw dumps. The two actions, `restart_service` and `open_ticket`, are
irreversible: they need an approval that shows the exact action and its dry run, take the run's
idempotency key (a retried call does not restart twice), and only the on-call engineer of the
owning team may restart a service.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from tether import tool
from tether.policy import Capability
from tether.tools import Tool, ToolContext

FIXTURES = Path(__file__).resolve().parent / "fixtures"
Metric = Literal["latency_p99_ms", "error_rate", "cpu", "rps"]
Level = Literal["INFO", "WARN", "ERROR"]


@dataclass
class Ops:
    """The world the tools act on: fixtures plus a ledger of the actions taken (per run or suite)."""

    logs: list[dict[str, str]]
    metrics: dict[str, dict[str, list[list[Any]]]]
    services: dict[str, dict[str, Any]]
    oncall: dict[str, str]
    ledger: list[dict[str, Any]] = field(default_factory=list)
    _done: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, root: Path = FIXTURES) -> Ops:
        logs = [json.loads(line) for line in (root / "logs.jsonl").read_text("utf-8").splitlines() if line]
        svc = json.loads((root / "services.json").read_text("utf-8"))
        return cls(logs, json.loads((root / "metrics.json").read_text("utf-8")), svc["services"], svc["oncall"])

    def team_of(self, service: str) -> str:
        if service not in self.services:
            raise ValueError(f"unknown service {service!r}; known: {', '.join(self.services)}")
        return self.services[service]["team"]

    def once(self, key: str, action: dict[str, Any], result: str) -> str:
        """Record an action once per idempotency key; a repeat returns the first result."""
        with self._lock:
            if key in self._done:
                return self._done[key] + " (already done: same idempotency key)"
            self.ledger.append({**action, "key": key})
            self._done[key] = result
            return result


def may_restart(ops: Ops):
    def check(user: str | None, args: dict[str, Any]) -> bool | str:
        service = args.get("service", "")
        if service not in ops.services:
            return True  # the tool itself says the service is unknown
        team = ops.team_of(service)
        if user is not None and ops.oncall.get(team) == user:
            return True
        return (f"only the on-call engineer of team {team} ({ops.oncall.get(team)}) may restart {service}; "
                f"ask them or page the team")
    return check


def build_tools(ops: Ops) -> list[Tool]:
    @tool(effect="read_only")
    def search_logs(query: str = "", service: str | None = None, level: Level | None = None,
                    limit: Annotated[int, Field(ge=1, le=50)] = 10) -> str:
        """Search the logs. Returns the newest matching lines with timestamps, and counts.

        Args:
            query: words or a regular expression to match in the message ("" matches all)
            service: only this service, e.g. "checkout"
            level: only this level
            limit: how many lines to show
        """
        try:
            rx = re.compile(query, re.IGNORECASE) if query else None
        except re.error:
            rx = re.compile(re.escape(query), re.IGNORECASE)
        rows = [r for r in ops.logs if (service is None or r["service"] == service)
                and (level is None or r["level"] == level) and (rx is None or rx.search(r["message"]))]
        if not rows:
            return "0 matching lines."
        counts = Counter((r["service"], r["level"]) for r in rows)
        head = f"{len(rows)} matching lines, first {rows[0]['ts']}, last {rows[-1]['ts']}. By service/level: "
        head += ", ".join(f"{s}/{lv} {n}" for (s, lv), n in counts.most_common())
        shown = rows[-limit:]
        return head + "\nNewest:\n" + "\n".join(f"{r['ts']} {r['service']} {r['level']} {r['message']}" for r in shown)

    @tool(effect="read_only")
    def query_metrics(service: str, metric: Metric) -> str:
        """Summary of one metric of one service over the last two hours (5-minute points).

        Args:
            service: the service, e.g. "checkout"
            metric: which metric
        """
        if service not in ops.metrics:
            raise ValueError(f"unknown service {service!r}; known: {', '.join(ops.metrics)}")
        points = ops.metrics[service][metric]
        values = [v for _, v in points]
        first_half = values[: len(values) // 2]
        base = sorted(first_half)[len(first_half) // 2]
        jump = next((t for t, v in points if base and v > 2 * base), None)
        lines = [f"{service} {metric}: last {values[-1]}, min {min(values)}, max {max(values)}, "
                 f"baseline (median of first hour) {base}"]
        lines.append(f"first point above 2x baseline: {jump}" if jump else "no point above 2x baseline")
        lines.append("points: " + ", ".join(f"{t[11:16]}={v}" for t, v in points[-8:]))
        return "\n".join(lines)

    @tool(effect="read_only")
    def read_runbook(service: str) -> str:
        """The runbook of a service.

        Args:
            service: the service, e.g. "payments-api"
        """
        path = FIXTURES / "runbooks" / f"{service}.md"
        if service not in ops.services or not path.exists():
            have = sorted(p.stem for p in (FIXTURES / "runbooks").glob("*.md"))
            raise ValueError(f"no runbook for {service!r}; runbooks exist for: {', '.join(have)}")
        return path.read_text("utf-8")

    @tool(effect="read_only")
    def list_services() -> str:
        """Every service with its team, on-call engineer and dependencies."""
        return "\n".join(f"{name}: team {s['team']}, on-call {ops.oncall[s['team']]}, depends on "
                         f"{', '.join(s['depends_on']) or 'nothing'}" for name, s in ops.services.items())

    def restart_preview(args: dict[str, Any]) -> str:
        service = args.get("service", "?")
        if service not in ops.services:
            return f"dry run: {service!r} is not a known service; nothing would happen"
        users = [n for n, s in ops.services.items() if service in s["depends_on"]]
        return (f"dry run: would restart all instances of {service} (team {ops.team_of(service)}); "
                f"in-flight requests dropped; callers affected: {', '.join(users) or 'none'}")

    @tool(effect="irreversible",
          describe=lambda a: f"restart {a.get('service')} because: {a.get('reason')}",
          dry_run=restart_preview)
    def restart_service(service: str, reason: str, context: ToolContext) -> str:
        """Restart every instance of a service. Drops requests in flight.

        Args:
            service: the service to restart
            reason: why, for the incident log
        """
        ops.team_of(service)
        return ops.once(context.idempotency_key, {"action": "restart", "service": service, "by": context.user},
                        f"restarted {service}: 3/3 instances healthy after 41 s")

    @tool(effect="irreversible",
          describe=lambda a: f"open a {a.get('severity')} ticket: {a.get('title')!r}",
          dry_run=lambda a: f"dry run: would page team of {a.get('service')} with severity {a.get('severity')}")
    def open_ticket(title: str, service: str, severity: Literal["low", "high", "critical"], body: str,
                    context: ToolContext) -> str:
        """Open an incident ticket for a service's team (pages them for high and critical).

        Args:
            title: one line
            service: the affected service
            severity: how bad
            body: what is known: symptoms, evidence, suspected cause
        """
        team = ops.team_of(service)
        n = 4000 + len(ops.ledger)
        return ops.once(context.idempotency_key, {"action": "ticket", "service": service, "title": title,
                                                  "severity": severity, "by": context.user},
                        f"opened INC-{n} for team {team} ({severity})")

    return [search_logs, query_metrics, read_runbook, list_services, restart_service, open_ticket]


def capabilities(ops: Ops) -> list[Capability]:
    """The actions always ask (approval shows the exact call and its dry run); restarts are authorized
    for the owning team's on-call engineer only."""
    return [
        Capability("restart_service", requires_approval=True, authorize=may_restart(ops), per_run=2),
        Capability("open_ticket", requires_approval=True, per_run=3),
    ]
