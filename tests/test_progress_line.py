"""The CLI's live line on a terminal (issue 27, item 4): what the run does, its step, tokens, cost and
time; nothing when stderr is piped; paused while a person answers an approval prompt."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from tether.cli._progress import Reporter, _LiveLine
from tether.events import ModelCallEnded, ToolCallEnded, ToolCallStarted


def test_the_live_line_shows_step_tokens_cost_and_the_tool_running() -> None:
    reporter = Reporter(Console(file=StringIO(), force_terminal=True), enabled=True)
    reporter.start()
    try:
        assert reporter._status is not None
        reporter(ModelCallEnded(model="m", input_tokens=1200, output_tokens=34, cost_usd=0.01, tool_calls=1,
                                step=1).envelope())
        reporter(ToolCallStarted(name="Bash", call_id="c1", step=1).envelope())
        line = _LiveLine(reporter).__rich__().plain
        assert line.startswith("running Bash... · step 1 · 1,234 tokens · $0.0100 · ") and line.endswith("s"), line
        reporter(ToolCallEnded(name="Bash", call_id="c1", step=1).envelope())
        assert _LiveLine(reporter).__rich__().plain.startswith("thinking... · step 1")
        with reporter.paused():  # an approval prompt: no line drawn over it
            assert reporter._status is None
        assert reporter._status is not None
    finally:
        reporter.stop()


def test_no_live_line_when_stderr_is_piped() -> None:
    reporter = Reporter(Console(file=StringIO(), force_terminal=False), enabled=True)
    reporter.start()
    assert reporter._status is None
