"""Progress on stderr: tool activity, model calls, the stop line. stdout stays for the answer."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.text import Text

from tether._terminal import clean
from tether._types import RunResult, StopReason
from tether.events import (
    ApprovalDecided,
    ApprovalRequested,
    CriticReviewed,
    Error,
    FilterVerdict,
    JobEnded,
    JobStarted,
    ModelCallEnded,
    ModelCallStarted,
    Notice,
    RunStarted,
    RunStopped,
    TextStreamed,
    ToolCallEnded,
    ToolCallStarted,
    TraceEvent,
    typed,
)

# Exit codes: 2 stays click's usage error, so scripts can tell a typo from a run that ran out of budget.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BUDGET = 3
EXIT_APPROVAL = 4
EXIT_UNASKED = 5  # calls needed approval and nobody could be asked (no terminal): they did not run
EXIT_REFUSED = 6  # the safety filter refused the request (no model call) or withheld the answer
EXIT_CANCELLED = 130

BUDGET_STOPS = {
    StopReason.MAX_STEPS: "the step limit",
    StopReason.TOKEN_BUDGET: "the token budget",
    StopReason.TIME_BUDGET: "the time budget",
    StopReason.COST_BUDGET: "the cost budget",
    StopReason.TOOL_CALL_BUDGET: "the tool-call budget",
    StopReason.LOOP_DETECTED: "a repeated tool call",
    StopReason.APPROVAL_BUDGET: "the approval budget",
}


RAISE_WITH = {  # the option that raises the limit a run stopped at
    StopReason.MAX_STEPS: "--max-steps",
    StopReason.TOKEN_BUDGET: "--max-tokens",
    StopReason.TIME_BUDGET: "--max-seconds",
    StopReason.COST_BUDGET: "--max-cost",
}


def exit_code(result: RunResult) -> int:
    if result.stop_reason is StopReason.COMPLETED:
        return EXIT_OK
    if result.stop_reason in BUDGET_STOPS:
        return EXIT_BUDGET
    if result.stop_reason is StopReason.AWAITING_APPROVAL:
        return EXIT_APPROVAL
    if result.stop_reason is StopReason.CANCELLED:
        return EXIT_CANCELLED
    if result.stop_reason in (StopReason.INPUT_REFUSED, StopReason.OUTPUT_REFUSED):
        return EXIT_REFUSED
    return EXIT_ERROR


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def stop_line(result: RunResult, answer_shown: bool = True) -> str:
    """One line saying why a run that did not complete stopped, and what it found."""
    found = _plural(len(result.findings), "finding")
    where = "partial answer on stdout" if result.answer.strip() and answer_shown else "no answer"
    if result.stop_reason in (StopReason.INPUT_REFUSED, StopReason.OUTPUT_REFUSED) and where != "no answer":
        where = "the filter's message on stdout"
    done = f"after {_plural(result.steps, 'step')} and {_plural(result.usage.tool_calls, 'tool call')}"
    reason = result.stop_reason
    if reason in BUDGET_STOPS:
        head = f"stopped at {BUDGET_STOPS[reason]} ({reason.value}) {done}"
        if reason in RAISE_WITH:
            head += f" (raise it with {RAISE_WITH[reason]})"
    elif reason is StopReason.CANCELLED:
        head = f"cancelled ({result.error or 'cancelled'}) {done}"
    elif reason is StopReason.AWAITING_APPROVAL:
        head = f"stopped {done}: a tool call awaits approval ({result.error or 'rerun with --yes to approve'})"
    elif reason is StopReason.INPUT_REFUSED:
        head = f"request refused (input_refused) {done}: {result.error or 'the input filter refused it'}"
    elif reason is StopReason.OUTPUT_REFUSED:
        head = f"answer withheld (output_refused) {done}: {result.error or 'the output filter withheld it'}"
    elif reason is StopReason.OUTPUT_INVALID:
        head = f"no valid output (output_invalid) {done}: {result.error or 'the answer did not validate'}"
    else:
        head = f"error {done}: {result.error or 'unknown error'}"
    return clean(" ".join(f"tether: {head}; {where}, {found}".split()))


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(clean(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call_text(name: str, arguments: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={_short(json.dumps(v, ensure_ascii=False, default=str), 60)}"
                     for k, v in arguments.items())
    return f"{name}({_short(args, 100)})"


class _LiveLine:
    """The spinner's text, rendered afresh on every refresh: what the run is doing, its step, tokens,
    cost so far and the seconds since it started."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    def __rich__(self) -> Text:
        r = self.reporter
        cost = f" · ${r.cost:.4f}" if r.cost else ""
        return Text(f"{r.doing}... · step {r.steps} · {r.tokens:,} tokens{cost} · "
                    f"{time.monotonic() - r._since:.0f}s", style="dim")


class Reporter:
    """Renders trace events on a rich console (stderr). Silent unless `enabled`. Text from models,
    tools and providers is shown without its terminal control sequences (terminal.clean)."""

    def __init__(self, console: Console, *, enabled: bool, verbose: bool = False) -> None:
        self.console = console
        self.enabled = enabled
        self.verbose = verbose
        self._status: Status | None = None
        self._paused = 0
        self._resume = False
        # what the live line shows (a terminal only): redrawn by rich's refresh, so the clock ticks
        self.doing = "thinking"
        self.steps = 0
        self.tokens = 0
        self.cost = 0.0
        self._since = time.monotonic()

    def announce(self, text: str) -> None:
        """Always shown: things the user must know (e.g. which model is used)."""
        self.console.print(escape(clean(text)), style="yellow", highlight=False)

    def start(self) -> None:
        if self.enabled and self.console.is_terminal and self._status is None and not self._paused:
            self._status = self.console.status(_LiveLine(self), spinner="dots")
            self._status.start()

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No spinner while inside (e.g. while a person answers an approval prompt); nests."""
        if self._status is not None:
            self._resume = True
            self.stop()
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            if self._paused == 0 and self._resume:
                self._resume = False
                self.start()

    def __call__(self, envelope: TraceEvent) -> None:
        if self.enabled:
            event = typed(envelope)
            self.HANDLED[type(event)](self, event)

    def _tool_started(self, event: ToolCallStarted) -> None:
        self.doing = f"running {clean(event.name)}"

    def _tool_ended(self, event: ToolCallEnded) -> None:
        self.doing = "thinking"
        mark = "[green]●[/]" if event.ran else "[red]●[/]"
        note = f"{event.result_chars} chars" + (", capped" if event.truncated else "")
        if not event.ran:
            note = f"{event.decision or 'error'}, {note}"
        self.console.print(f"{mark} {escape(_call_text(event.name, event.arguments))} "
                           f"[dim]{escape(note)}, {event.duration:.2f}s[/]", highlight=False)

    def _model_ended(self, event: ModelCallEnded) -> None:
        self.steps = event.step
        self.tokens += event.input_tokens + event.output_tokens
        self.cost += event.cost_usd
        n = event.tool_calls
        self.doing = f"running {_plural(n, 'tool call')}" if n else "done"
        if self.verbose:
            final = " (final answer call)" if event.final else ""
            self.console.print(
                f"[dim]· model {escape(clean(event.model))}{final}: {event.input_tokens} in / "
                f"{event.output_tokens} out tokens, ${event.cost_usd:.4f}, {event.duration:.2f}s[/]", highlight=False)

    def _approval_requested(self, event: ApprovalRequested) -> None:
        self.console.print(f"[yellow]? {escape(_call_text(event.tool, event.arguments))} waits for approval[/]",
                           highlight=False)

    def _approval_decided(self, event: ApprovalDecided) -> None:
        verdict = "approved" if event.approved else "denied"
        self.console.print(f"[yellow]! call {escape(clean(event.call_id))} {verdict} by {escape(clean(event.by))}[/]",
                           highlight=False)

    def _notice(self, event: Notice) -> None:
        self.console.print(f"[yellow]! {escape(_short(event.data, 200))}[/]", highlight=False)

    def _error(self, event: Error) -> None:
        self.console.print(f"[red]! {escape(clean(event.error))}[/]", highlight=False)

    def _critic(self, event: CriticReviewed) -> None:
        if self.verbose:
            self.console.print(f"[dim]· critic: {'ok' if event.ok else escape(_short(event.reasons, 200))}[/]",
                               highlight=False)

    def _filter(self, event: FilterVerdict) -> None:
        what = ("refused" if event.side == "input" else "withheld") if event.flagged else "passed"
        line = f"{event.side} filter {what}: score {event.score:.2f} / {event.threshold:.2f}" + (
            f" ({'; '.join(event.reasons)})" if event.reasons else "") + (" [cached]" if event.cached else "")
        if event.flagged:
            self.console.print(f"[red]! {escape(clean(line))}[/]", highlight=False)
        elif self.verbose:
            self.console.print(f"[dim]· {escape(clean(line))}[/]", highlight=False)

    def _job(self, event: JobStarted | JobEnded) -> None:
        if isinstance(event, JobStarted):
            line = f"job {event.job_id} started: {event.name}"
        else:
            line = f"job {event.job_id} {event.status}: {event.name} ({event.result_chars} chars)"
        self.console.print(f"[dim]· {escape(clean(line))}[/]", highlight=False)

    def _nothing(self, event: object) -> None:
        """Kinds the live view shows through others (a start opens what its end prints; the stop is the
        summary; streamed text is printed by the runner)."""

    # Every event type, each with its handler: tests/test_events.py checks none is missing.
    HANDLED: ClassVar[dict[type, Callable[[Reporter, Any], None]]] = {
        RunStarted: _nothing, ModelCallStarted: _nothing, ModelCallEnded: _model_ended, TextStreamed: _nothing,
        ToolCallStarted: _tool_started, ToolCallEnded: _tool_ended, ApprovalRequested: _approval_requested,
        ApprovalDecided: _approval_decided, Notice: _notice, Error: _error, RunStopped: _nothing,
        CriticReviewed: _critic, FilterVerdict: _filter, JobStarted: _job, JobEnded: _job,
    }

    def summary(self, result: RunResult) -> None:
        """A dim usage line after a run (progress mode only)."""
        if not self.enabled:
            return
        u = result.usage
        self.console.print(
            f"[dim]{result.stop_reason.value}: {_plural(result.steps, 'step')}, "
            f"{_plural(u.tool_calls, 'tool call')}, {u.total_tokens} tokens, ${u.cost_usd:.4f}, "
            f"{u.seconds:.1f}s[/]", highlight=False)
