"""Exit codes and the one stderr line for every way a run can end."""

from __future__ import annotations

import pytest

from tether._types import RunResult, StopReason, Usage
from tether.cli._progress import exit_code, stop_line

EXPECTED = {
    StopReason.COMPLETED: 0,
    StopReason.ERROR: 1,
    StopReason.OUTPUT_INVALID: 1,  # no validated output: an error for a pipeline
    StopReason.MAX_STEPS: 3,
    StopReason.TOKEN_BUDGET: 3,
    StopReason.TIME_BUDGET: 3,
    StopReason.COST_BUDGET: 3,
    StopReason.TOOL_CALL_BUDGET: 3,
    StopReason.LOOP_DETECTED: 3,
    StopReason.APPROVAL_BUDGET: 3,
    StopReason.AWAITING_APPROVAL: 4,
    StopReason.CANCELLED: 130,
    StopReason.INPUT_REFUSED: 6,  # the safety filter refused the request (--strictness)
    StopReason.OUTPUT_REFUSED: 6,  # ... or withheld the answer
}


def test_every_stop_reason_has_an_exit_code() -> None:
    assert set(EXPECTED) == set(StopReason)
    for reason, code in EXPECTED.items():
        assert exit_code(RunResult("r", reason, "")) == code


@pytest.mark.parametrize("reason", [r for r in StopReason if r is not StopReason.COMPLETED])
def test_stop_line_is_one_line_naming_the_reason(reason: StopReason) -> None:
    result = RunResult("r", reason, "half done", findings=["a", "b"], usage=Usage(tool_calls=2), steps=4,
                       error="boom\nsecond line" if reason in (StopReason.ERROR, StopReason.CANCELLED) else None)
    line = stop_line(result)
    assert "\n" not in line and line.startswith("tether: ")
    assert "after 4 steps and 2 tool calls" in line
    refused = reason in (StopReason.INPUT_REFUSED, StopReason.OUTPUT_REFUSED)
    assert line.endswith("the filter's message on stdout, 2 findings" if refused else "partial answer on stdout, 2 findings")
    if reason is StopReason.ERROR:
        assert "boom second line" in line
    elif reason is not StopReason.AWAITING_APPROVAL:
        assert f"({reason.value})" in line or "(boom second line)" in line


def test_stop_line_without_an_answer() -> None:
    line = stop_line(RunResult("r", StopReason.LOOP_DETECTED, "  ", findings=["x"], steps=1))
    assert line == ("tether: stopped at a repeated tool call (loop_detected) after 1 step and 0 tool calls; "
                    "no answer, 1 finding")
