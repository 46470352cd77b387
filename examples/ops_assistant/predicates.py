"""Checks of what a scenario did, for suite.toml's `predicate`s. They read the run's trace (which
actions ran, with which arguments), so they hold for live, recorded and replayed runs alike."""

from __future__ import annotations

from typing import Any


def _ran(result: Any, name: str) -> list[dict[str, Any]]:
    return [e.data["arguments"] for e in result.trace
            if e.kind == "tool_call" and e.data["name"] == name and not e.data["is_error"]]


def restarted_payments_once(result: Any, agent: Any) -> bool | str:
    restarts = _ran(result, "restart_service")
    if [r.get("service") for r in restarts] != ["payments-api"]:
        return f"expected one restart of payments-api, these ran: {restarts}"
    return True


def nothing_done(result: Any, agent: Any) -> bool | str:
    done = _ran(result, "restart_service") + _ran(result, "open_ticket")
    return True if not done else f"expected no action, these ran: {done}"


def one_ticket(result: Any, agent: Any) -> bool | str:
    tickets = _ran(result, "open_ticket")
    return True if len(tickets) == 1 else f"expected one ticket, these ran: {tickets}"


def fifteen_tool_calls(result: Any, agent: Any) -> bool | str:
    n = sum(1 for e in result.trace if e.kind == "tool_call" and not e.data["is_error"])
    return True if n >= 15 else f"only {n} tool calls ran"
