"""One run from the command line: Ctrl-C cancels it cleanly, events go to progress and trace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO

from tether._agent import Agent
from tether._loop import CancelToken
from tether._terminal import clean, json_safe
from tether._trace import JsonlTraceWriter
from tether._types import Message, RunResult, to_json
from tether.cli._progress import Reporter, exit_code, stop_line
from tether.events import TraceEvent

INTERRUPT_REASON = "interrupted by Ctrl-C"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


@contextlib.contextmanager
def sigint_cancels(cancel: CancelToken, on_first: Callable[[], None] | None = None) -> Iterator[None]:
    """While inside, the first Ctrl-C cancels the run (it ends with its partial state); a second
    one exits at once. Outside the main thread (tests, embedding) nothing is installed."""
    loop = asyncio.get_running_loop()
    presses = 0

    def handler() -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            os._exit(130)
        if on_first is not None:
            on_first()
        cancel.cancel(INTERRUPT_REASON)

    try:
        loop.add_signal_handler(signal.SIGINT, handler)
        installed = True
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
        installed = False
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)


async def run_turn(
    agent: Agent,
    prompt: str,
    *,
    history: Iterable[Message] = (),
    reporter: Reporter,
    trace: JsonlTraceWriter | None = None,
    run_id: str | None = None,
) -> RunResult:
    """Run one prompt; Ctrl-C cancels it and the partial RunResult comes back."""
    cancel = CancelToken()
    run_id = run_id or new_run_id()
    if trace is not None:
        trace.run_id = run_id
    sinks: list[Callable[[TraceEvent], None]] = [reporter]
    if trace is not None:
        sinks.append(trace)

    def on_event(event: TraceEvent) -> None:
        for sink in sinks:
            sink(event)

    def first_interrupt() -> None:
        reporter.stop()
        reporter.console.print("[yellow]cancelling... (Ctrl-C again to quit at once)[/]", highlight=False)

    reporter.start()
    try:
        with sigint_cancels(cancel, first_interrupt):
            state = agent.state_from(history, run_id=run_id) if history else None  # a chat's earlier turns
            return await agent.arun(prompt, state=state, run_id=run_id, cancel=cancel, on_event=on_event)
    finally:
        reporter.stop()


def report(result: RunResult, reporter: Reporter, *, as_json: bool, as_output: bool = False,
           out: TextIO | None = None, raw: bool = False) -> int:
    """Write the answer (or the JSON RunResult) to stdout, the stop line to stderr; return the exit code.

    `as_output` (--output-schema): stdout gets only the validated output as JSON, or nothing. The
    answer loses its terminal control sequences unless `raw` (JSON escapes them)."""
    out = out or sys.stdout
    assert out is not None, "no standard output"
    if as_json:
        out.write(json_safe(to_json(result)) + "\n")
    elif as_output:
        if result.output is not None:
            out.write(json_safe(json.dumps(result.output, ensure_ascii=False)) + "\n")
    else:
        answer = result.answer if raw else clean(result.answer)
        if answer.strip():
            out.write(answer.rstrip("\n") + "\n")
    out.flush()
    code = exit_code(result)
    if code != 0:
        reporter.console.print(stop_line(result, answer_shown=not as_output), style="red", highlight=False,
                               markup=False, soft_wrap=True)
    reporter.summary(result)
    return code
