"""Approvals: who may let a guarded call run, bound to the exact tool and canonical arguments.

Deny by default. An approval is for one action (tool name + canonical arguments): change any
argument and it no longer applies. Approvers answer `approved`, `denied` or `pending`; `pending`
stops the run with `awaiting_approval`, and the task service records the human's answer in an
`ApprovalBook` so the resumed run's identical call goes through.
"""

from __future__ import annotations

import asyncio
import getpass
import inspect
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tether.policy._canonical import action_key

Status = Literal["approved", "denied", "pending"]


class TextSink(Protocol):
    """Where a terminal approver shows its request: a text stream (or a wrapper of one)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What an approver is asked about: one exact action, explained."""

    run_id: str
    user: str | None
    tool: str
    arguments: dict[str, Any]
    key: str  # action_key(tool, arguments)
    description: str  # a human sentence, from the tool's `describe(args)` when it has one
    reason: str  # why approval is needed
    effect: str = "irreversible"
    provenance: dict[str, str] = field(default_factory=dict)
    dry_run: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    status: Status
    by: str = ""
    reason: str = ""

    @property
    def approved(self) -> bool:
        return self.status == "approved"


class Approver(Protocol):
    """Decides on guarded calls. Must be safe to call concurrently."""

    async def request(self, req: ApprovalRequest) -> ApprovalDecision: ...


class DenyAll:
    """The default: nothing guarded runs."""

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("denied", "default", "no approver is configured; guarded calls are denied")


class AutoApprove:
    """Approves everything (the CLI's `--yes`). Still audited, with `by`. Asks no person, so its
    answers do not count toward a run's approval budget (`SafetyPolicy(max_approvals=)`)."""

    asks_a_person = False

    def __init__(self, by: str = "auto(--yes)") -> None:
        self.by = by

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("approved", self.by)


class OracleApprover:
    """For evals: approves exactly the listed actions (tool, arguments) and denies the rest.
    Counts requests in `asked` so benchmarks can report approval prompts."""

    def __init__(self, allowed: Iterable[tuple[str, dict[str, Any]]], by: str = "oracle") -> None:
        self.allowed = {action_key(name, args) for name, args in allowed}
        self.by = by
        self.asked: list[ApprovalRequest] = []

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        self.asked.append(req)
        if req.key in self.allowed:
            return ApprovalDecision("approved", self.by)
        return ApprovalDecision("denied", self.by, "not an action the task needs")


DecideFn = Callable[[ApprovalRequest], "ApprovalDecision | bool | Awaitable[ApprovalDecision | bool]"]


class CallbackApprover:
    """Wraps a function (sync or async) returning an ApprovalDecision or a bool."""

    def __init__(self, fn: DecideFn, by: str = "callback") -> None:
        self.fn = fn
        self.by = by

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        out = self.fn(req)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, ApprovalDecision):
            return out
        return ApprovalDecision("approved" if out else "denied", self.by)


class TerminalApprover:
    """Asks a person at the terminal, showing the exact action, why, and the dry run if any.

    `ask` reads one answer line (default `input`); `out` is where the request is shown (stderr).
    Only `y` or `yes` approves; anything else, EOF included, denies.
    """

    def __init__(self, *, ask: Callable[[str], str] = input, out: TextSink | None = None, by: str | None = None) -> None:
        self.ask = ask
        self.out = out
        self.by = by or _whoami()
        self._lock = asyncio.Lock()

    def render(self, req: ApprovalRequest) -> str:
        lines = [
            f"Approval needed ({req.effect}): {req.description}",
            f"  tool: {req.tool}",
            f"  arguments: {json.dumps(req.arguments, ensure_ascii=False, sort_keys=True, default=str)}",
            f"  why: {req.reason}",
        ]
        risky = {p: o for p, o in req.provenance.items() if o in ("untrusted", "model")}
        if risky:
            lines.append("  not from your request: " + ", ".join(f"{p or 'value'} ({o})" for p, o in risky.items()))
        if req.dry_run:
            lines.append("  dry run: " + req.dry_run.replace("\n", "\n    "))
        return "\n".join(lines)

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        async with self._lock:  # one question at a time
            out = self.out or sys.stderr
            print(self.render(req), file=out, flush=True)
            try:
                answer = await asyncio.to_thread(self.ask, "Approve? [y/N] ")
            except (EOFError, KeyboardInterrupt):
                answer = ""
        if answer.strip().lower() in ("y", "yes"):
            return ApprovalDecision("approved", self.by)
        return ApprovalDecision("denied", self.by, "declined at the terminal")


def _whoami() -> str:
    try:
        return "terminal:" + getpass.getuser()
    except Exception:
        return "terminal"


class ApprovalBook:
    """Recorded decisions, per run, bound to action keys. Approvals are single-use by default.

    The task service: an approver returns `pending` (see `PendingApprover`), the run stops
    `awaiting_approval`, a human answers through the API -> `grant(...)`/`deny(...)`, the run resumes
    and its identical call is let through (a changed argument would need a new approval).

    A run that is parked and then abandoned never comes back for its entries: a pending request, or a
    decision for one run, is dropped `ttl` seconds after it was made (default 7 days, a durable run's
    approval deadline), and beyond `max_pending` requests the oldest go; `forget(run_id)` drops a
    finished run's at once.
    """

    def __init__(self, *, ttl: float | None = 7 * 86_400.0, max_pending: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._decisions: dict[tuple[str | None, str], ApprovalDecision] = {}
        self.pending: dict[tuple[str, str], ApprovalRequest] = {}
        self.ttl = ttl
        self.max_pending = max_pending
        self._clock = clock
        self._since: dict[tuple[str | None, str], float] = {}  # a pending request's or a run's decision's time, oldest first

    def _note(self, key: tuple[str | None, str]) -> None:
        """Stamp `key` now (moved to the end: the newest) and drop what has expired."""
        now = self._clock()
        self._since.pop(key, None)
        self._since[key] = now
        horizon = None if self.ttl is None else now - self.ttl
        while self._since:
            oldest, at = next(iter(self._since.items()))
            if not ((horizon is not None and at < horizon) or len(self.pending) > self.max_pending):
                break
            del self._since[oldest]
            if oldest[0] is not None:
                self.pending.pop(oldest, None)  # type: ignore[arg-type]  # its run id is a str there
                self._decisions.pop(oldest, None)

    def forget(self, run_id: str) -> None:
        """Drop a run's pending requests and its decisions (the run has ended)."""
        for key in [k for k in self._since if k[0] == run_id]:
            del self._since[key]
        for key in [k for k in self.pending if k[0] == run_id]:
            del self.pending[key]
        for key in [k for k in self._decisions if k[0] == run_id]:
            del self._decisions[key]

    def grant(self, tool: str, arguments: dict[str, Any], by: str, *, run_id: str | None = None) -> str:
        """Approve one exact action (for one run, or any run when run_id is None). Returns its key."""
        key = action_key(tool, arguments)
        self._decisions[(run_id, key)] = ApprovalDecision("approved", by)
        if run_id is not None:
            self.pending.pop((run_id, key), None)
            self._note((run_id, key))
        return key

    def deny(self, tool: str, arguments: dict[str, Any], by: str, *, run_id: str | None = None, reason: str = "") -> str:
        key = action_key(tool, arguments)
        self._decisions[(run_id, key)] = ApprovalDecision("denied", by, reason)
        if run_id is not None:
            self.pending.pop((run_id, key), None)
            self._note((run_id, key))
        return key

    def take(self, run_id: str, key: str) -> ApprovalDecision | None:
        """The recorded decision for this action, consumed if it is an approval."""
        for scope in (run_id, None):
            decision = self._decisions.get((scope, key))
            if decision is not None:
                if decision.approved:
                    del self._decisions[(scope, key)]
                return decision
        return None

    def add_pending(self, req: ApprovalRequest) -> None:
        self.pending[(req.run_id, req.key)] = req
        self._note((req.run_id, req.key))

    def pending_for(self, run_id: str) -> list[ApprovalRequest]:
        return [r for (rid, _), r in self.pending.items() if rid == run_id]


class PendingApprover:
    """For the task service: never decides now. Each request is recorded (and `notify` is called,
    e.g. to push it to the UI); the run stops `awaiting_approval`."""

    def __init__(self, book: ApprovalBook, notify: Callable[[ApprovalRequest], Any] | None = None) -> None:
        self.book = book
        self.notify = notify

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        self.book.add_pending(req)
        if self.notify is not None:
            out = self.notify(req)
            if inspect.isawaitable(out):
                await out
        return ApprovalDecision("pending", "", "waiting for a person to approve")
