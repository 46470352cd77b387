"""`tether chat`: a conversation across turns, from a terminal or from piped stdin.

Each line is a turn; the next turn continues from the previous run's messages. `/exit` (or
`/quit`, or end of input) leaves, `/reset` forgets the conversation. Ctrl-C during a turn cancels
that turn and keeps the conversation; Ctrl-C at the prompt leaves.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TextIO

from rich.markup import escape

from tether._agent import Agent
from tether._terminal import clean
from tether._trace import JsonlTraceWriter
from tether._types import Message, RunResult
from tether.cli._progress import EXIT_CANCELLED, EXIT_OK, Reporter
from tether.cli._runner import report, run_turn

HELP = "commands: /exit (or /quit) leaves, /reset forgets the conversation, /help shows this"


def _read_line(stdin: TextIO, interactive: bool, reporter: Reporter) -> str | None:
    """The next line, or None at end of input."""
    if interactive:
        try:
            return input("you> ")
        except EOFError:
            return None
    line = stdin.readline()
    return None if line == "" else line


def chat(
    agent: Agent,
    reporter: Reporter,
    *,
    as_json: bool = False,
    trace: JsonlTraceWriter | None = None,
    stdin: TextIO | None = None,
    raw: bool = False,
    on_turn: Callable[[RunResult, str], None] | None = None,
    after_turn: Callable[[bool], None] | None = None,
) -> int:
    """Run the conversation; returns the exit code of the last turn (0 when there was none).
    `on_turn` gets each turn's result and line once its answer is shown (the run store's record);
    `after_turn(interactive)` runs after that (the review of staged changes)."""
    stdin = stdin or sys.stdin
    assert stdin is not None, "no standard input"
    interactive = stdin.isatty() and sys.stdout.isatty()
    if interactive:
        reporter.console.print(f"[dim]tether chat with {escape(clean(agent.model.name))}; {HELP}[/]", highlight=False)
    history: list[Message] = []
    code = EXIT_OK
    with asyncio.Runner() as runner:
        while True:
            try:
                line = _read_line(stdin, interactive, reporter)
            except KeyboardInterrupt:
                reporter.console.print()
                return EXIT_CANCELLED
            if line is None:
                return code
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                return code
            if text == "/reset":
                history = []
                reporter.console.print("[dim]conversation forgotten[/]", highlight=False)
                continue
            if text == "/help":
                reporter.console.print(HELP, highlight=False, markup=False)
                continue
            result = runner.run(run_turn(agent, text, history=history, reporter=reporter, trace=trace))
            history = result.messages
            code = report(result, reporter, as_json=as_json, raw=raw)
            if on_turn is not None:
                on_turn(result, text)
            if after_turn is not None:
                after_turn(interactive)
