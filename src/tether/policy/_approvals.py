"""Approvals: who may let a guarded call run, bound to the exact tool and canonical arguments.

Deny by default. An approval is for one action (tool name + canonical arguments): change any
argument and it no longer applies. Approvers answer `approved`, `denied` or `pending`; `pending`
stops the run with `awaiting_approval`, and the task service records the human's answer in an
`ApprovalBook` so the resumed run's identical call goes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import getpass
import inspect
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tether._errors import InvalidInput
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


@dataclass(frozen=True, slots=True)
class ApprovalBatch:
    """One question for calls a model turn announced together: each call's own request (bound to its
    exact action key) and a summary of the group (`batch_summary`)."""

    id: str
    requests: tuple[ApprovalRequest, ...]
    summary: str


class BatchApprover(Approver, Protocol):
    """An approver that answers a group in one question: one decision per request, in order. An
    approver without `request_batch` is asked once per call."""

    async def request_batch(self, batch: ApprovalBatch) -> list[ApprovalDecision]: ...


def asks_in_batches(approver: object) -> bool:
    """Whether `approver` answers a group of calls as one question (`request_batch`; a wrapper says so
    with a `batches` attribute)."""
    return bool(getattr(approver, "batches", callable(getattr(approver, "request_batch", None))))


# A tool declares how its calls add up in a batch question with metadata={"approval_summary": {...}}:
# "noun" (one call: "payment"), "amount" (the argument summed), "party" (the argument counted, e.g. the
# recipient) and "party_noun" ("payee"). Plural forms add an "s".
SUMMARY_KEY = "approval_summary"


def batch_summary(requests: Iterable[ApprovalRequest], declared: dict[str, dict[str, Any]] | None = None) -> str:
    """A short sentence for a group of calls: by the tool's declared fields where it declares them
    ("3 payments, 1,240.00 in total, to these 2 payees: A, B"), else the exact calls listed."""
    groups: dict[str, list[ApprovalRequest]] = {}
    for req in requests:
        groups.setdefault(req.tool, []).append(req)
    parts: list[str] = []
    for tool, reqs in groups.items():
        spec = (declared or {}).get(tool) or {}
        if not spec:
            parts.extend(f"{r.tool}({_short_args(r.arguments)})" for r in reqs)
            continue
        noun = str(spec.get("noun") or tool)
        text = f"{len(reqs)} {noun}{'' if len(reqs) == 1 else 's'}"
        amount = spec.get("amount")
        if amount:
            values = [r.arguments.get(amount) for r in reqs]
            nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if len(nums) == len(values):
                text += f", {sum(nums):,.2f} in total"
            else:
                text += f" (amounts: {', '.join(repr(v) for v in values)})"
        party = spec.get("party")
        if party:
            names = list(dict.fromkeys(json.dumps(r.arguments.get(party), ensure_ascii=False, default=str)
                                       .strip('"') for r in reqs))
            pnoun = str(spec.get("party_noun") or party)
            text += f", to {'this' if len(names) == 1 else f'these {len(names)}'} {pnoun}" \
                    f"{'' if len(names) == 1 else 's'}: {', '.join(names)}"
        parts.append(text)
    return "; ".join(parts)


def _short_args(arguments: dict[str, Any], limit: int = 80) -> str:
    text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in arguments.items())
    return text if len(text) <= limit else text[:limit - 1] + "…"


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
        return self._decide(req)

    def _decide(self, req: ApprovalRequest) -> ApprovalDecision:
        if req.key in self.allowed:
            return ApprovalDecision("approved", self.by)
        return ApprovalDecision("denied", self.by, "not an action the task needs")

    async def request_batch(self, batch: ApprovalBatch) -> list[ApprovalDecision]:
        """One prompt for the group (`asked` grows by one, its first request), decided call by call."""
        self.asked.append(batch.requests[0])
        return [self._decide(req) for req in batch.requests]


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

    async def _answer(self, prompt: str) -> str:
        try:
            return (await asyncio.to_thread(self.ask, prompt)).strip().lower()
        except (EOFError, KeyboardInterrupt):
            return ""

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        async with self._lock:  # one question at a time
            return await self._request(req)

    async def _request(self, req: ApprovalRequest) -> ApprovalDecision:
        rule = suggested_rule(req)
        choices = "[y/N, v to view in full" + (f", a to allow '{rule}' for this run" if rule else "") + "] "
        out = self.out or sys.stderr
        print(self.render(req), file=out, flush=True)
        while True:
            answer = await self._answer(f"Approve? {choices}")
            if answer in ("v", "view"):  # every argument whole: nothing approved unseen
                print(show_whole(req.arguments), file=out, flush=True)
                continue
            break
        if answer in ("y", "yes"):
            return ApprovalDecision("approved", self.by)
        if rule and answer in ("a", "allow"):
            return ApprovalDecision("approved", self.by, ADD_RULE + rule)
        return ApprovalDecision("denied", self.by, "declined at the terminal")

    async def request_batch(self, batch: ApprovalBatch) -> list[ApprovalDecision]:
        """The group in one question, each call shown in full below its summary: `y` approves all,
        `o` asks call by call, anything else (EOF included) denies all."""
        n = len(batch.requests)
        async with self._lock:
            out = self.out or sys.stderr
            lines = [f"Approval needed for {n} calls announced together: {batch.summary}"]
            for k, req in enumerate(batch.requests, 1):
                lines.append(f"[{k}/{n}] " + self.render(req).replace("\n", "\n      "))
            print("\n".join(lines), file=out, flush=True)
            while True:
                answer = await self._answer(f"Approve all {n}? [y = all, N = none, o = one by one, v to view in full] ")
                if answer in ("v", "view"):
                    for k, req in enumerate(batch.requests, 1):
                        print(f"[{k}/{n}]\n" + show_whole(req.arguments), file=out, flush=True)
                    continue
                break
            if answer in ("o", "one"):
                return [await self._request(req) for req in batch.requests]
        if answer in ("y", "yes", "a", "all"):
            return [ApprovalDecision("approved", self.by) for _ in batch.requests]
        return [ApprovalDecision("denied", self.by, "declined at the terminal") for _ in batch.requests]


def show_whole(arguments: dict[str, Any]) -> str:
    """Every argument in full, one block each (strings as written, other values as JSON)."""
    blocks = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2, default=str)
        blocks.append(f"--- {key} ({len(text):,} characters) ---\n{text}")
    return "\n".join(blocks) + "\n--- end ---"


# ---- allow rules: per-run approvals of a kind of call, given once ---------------------------------------

RULE_BY = "rule:"  # `ApprovalDecision.by` of a call an allow rule approved (no person asked)
ADD_RULE = "allow for this run: "  # reason of a person's approval that also adds a rule
# A rule approves only simple commands: chaining, substitution, redirection or a new line would let a
# matching prefix carry anything after it.
_SHELL_META = frozenset(";&|<>`$()\n\r{}\\")


def call_subject(arguments: dict[str, Any]) -> str:
    """What an allow rule's pattern is matched against: the one string argument (Bash's command),
    else the arguments as canonical JSON."""
    strings = [v for v in arguments.values() if isinstance(v, str)]
    if len(arguments) == 1 and len(strings) == 1:
        return strings[0]
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class AllowRule:
    """`Tool(pattern)`: approve calls of `Tool` whose subject (`call_subject`) matches the shell-style
    `pattern` (`*` any text), e.g. `Bash(pytest *)`, `Bash(git status)`; `Tool` alone: every call.
    A command holding shell operators (`;`, `&&`, `|`, `$(`, redirections, new lines) matches no rule."""

    tool: str
    pattern: str = "*"

    @classmethod
    def parse(cls, text: str) -> AllowRule:
        text = text.strip()
        name, sep, rest = text.partition("(")
        if not name.strip() or (sep and not rest.endswith(")")) or not name.strip().replace("_", "").replace(
                "-", "").replace(".", "").isalnum():
            raise InvalidInput(f"{text!r} is not a rule; write Tool(pattern), e.g. 'Bash(pytest *)'")
        pattern = rest[:-1].strip() if sep else "*"
        if not pattern:
            raise InvalidInput(f"{text!r} has an empty pattern; write Tool(*) to allow every call of Tool")
        return cls(name.strip(), pattern)

    def matches(self, tool: str, arguments: dict[str, Any]) -> bool:
        if tool != self.tool:
            return False
        subject = call_subject(arguments)
        if any(ch in _SHELL_META for ch in subject):
            return False
        return fnmatch.fnmatchcase(subject.strip(), self.pattern)

    def __str__(self) -> str:
        return f"{self.tool}({self.pattern})"


def suggested_rule(req: ApprovalRequest) -> str | None:
    """The rule a person may add at the prompt for this call: its command's program (and a plain
    subcommand word) followed by `*`, e.g. `Bash(pytest *)`, `Bash(git status *)`; None when the call
    has no single command or it holds shell operators."""
    subject = call_subject(req.arguments)
    if subject.startswith("{") or not subject.strip() or any(ch in _SHELL_META for ch in subject):
        return None
    words = subject.split()
    prefix = words[:2] if len(words) > 1 and words[1].isalpha() else words[:1]
    return str(AllowRule(req.tool, " ".join(prefix) + " *"))


class RuleApprover:
    """Approves the calls an `AllowRule` matches without asking anyone (`by` = `rule:...`, not counted
    by the approval budget: the person gave the rule once); asks `inner` for the others. A person's
    approval that says to allow such calls for the run (the terminal's `a`) adds its rule."""

    def __init__(self, rules: Iterable[AllowRule], inner: Approver) -> None:
        self.rules = list(rules)
        self.inner = inner

    @property
    def asks_a_person(self) -> bool:
        return bool(getattr(self.inner, "asks_a_person", True))

    @property
    def batches(self) -> bool:
        return asks_in_batches(self.inner)

    async def request_batch(self, batch: ApprovalBatch) -> list[ApprovalDecision]:
        """The inner approver's answer to the group (the policy leaves calls a rule allows out of it)."""
        decisions = await self.inner.request_batch(batch)  # type: ignore[attr-defined]  # see `batches`
        for decision in decisions:
            if decision.approved and decision.reason.startswith(ADD_RULE):
                with contextlib.suppress(ValueError):
                    self.rules.append(AllowRule.parse(decision.reason[len(ADD_RULE):]))
        return list(decisions)

    def allows(self, tool: str, arguments: dict[str, Any]) -> bool:
        """Whether a rule approves this call (then nobody is asked)."""
        return any(rule.matches(tool, arguments) for rule in self.rules)

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        for rule in self.rules:
            if rule.matches(req.tool, req.arguments):
                return ApprovalDecision("approved", f"{RULE_BY}{rule}")
        decision = await self.inner.request(req)
        if decision.approved and decision.reason.startswith(ADD_RULE):
            with contextlib.suppress(ValueError):
                self.rules.append(AllowRule.parse(decision.reason[len(ADD_RULE):]))
        return decision


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
