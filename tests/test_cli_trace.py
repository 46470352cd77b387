"""JsonlTraceWriter: one flushed JSON line per TraceEvent, as an `on_event` sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import Agent, Limits
from tether._trace import JsonlTraceWriter, read_trace
from tether._types import TraceEvent
from tether.models._scripted import ScriptedModel, call, reply
from tether.tools.builtin import calculator


def test_one_line_per_event_flushed_as_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    model = ScriptedModel([reply("", call("calculator", expression="3 * 4"), input_tokens=5, output_tokens=2),
                           reply("12", input_tokens=9, output_tokens=1)])
    agent = Agent(model, tools=[calculator], limits=Limits(max_steps=5))
    writer = JsonlTraceWriter(path, run_id="run-a")
    seen_on_disk: list[int] = []

    def sink(event: TraceEvent) -> None:
        writer(event)
        seen_on_disk.append(len(path.read_text().splitlines()))  # flushed before the next event

    result = agent.run("3 times 4?", on_event=sink)
    writer.close()
    records = read_trace(path)
    assert result.answer == "12"
    assert len(records) == len(result.trace) == writer.lines == 8
    assert seen_on_disk == [1, 2, 3, 4, 5, 6, 7, 8]
    for record, event in zip(records, result.trace, strict=True):
        assert (record["kind"], record["step"], record["data"]) == (event.kind, event.step, event.data)
        assert record["run_id"] == "run-a"
        assert record["t"] == pytest.approx(event.t, abs=1e-6)
    assert [r["kind"] for r in records] == ["run_started", "model_call_started", "model_call", "tool_call_started",
                                            "tool_call", "model_call_started", "model_call", "stop"]
    assert records[2]["data"]["input_tokens"] == 5
    assert records[4]["data"]["arguments"] == {"expression": "3 * 4"}


def test_deltas_are_skipped_unless_asked_and_odd_values_become_strings(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with JsonlTraceWriter(path, clock=lambda: 100.0) as writer:
        writer(TraceEvent("text_delta", 1, 0.1, data={"text": "hi"}))
        writer(TraceEvent("notice", 1, 0.2, data={"path": Path("/x"), "n": {1, 2}.__len__()}))
    assert read_trace(path) == [
        {"time": 100.0, "kind": "notice", "step": 1, "t": 0.2, "duration": 0.0, "data": {"path": "/x", "n": 2}}
    ]
    with JsonlTraceWriter(path, append=True, deltas=True) as writer:
        writer(TraceEvent("text_delta", 2, 0.3, data={"text": "hi"}))
    assert [r["kind"] for r in read_trace(path)] == ["notice", "text_delta"]


def test_closed_writer_refuses_events(tmp_path: Path) -> None:
    writer = JsonlTraceWriter(tmp_path / "sub" / "t.jsonl")
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer(TraceEvent("stop", 0, 0.0))
