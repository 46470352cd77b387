"""`JsonlTraceWriter`: an `on_event` sink writing one JSON line per `TraceEvent`.

    with JsonlTraceWriter("run.jsonl") as trace:
        result = await agent.arun(prompt, on_event=trace)

Each line: `{"time": <unix seconds>, "run_id": ..., "kind": ..., "step": ..., "t": <seconds since
the run started>, "duration": ..., "data": {...}}`, flushed as it is written so a crashed or
interrupted run still leaves every event that happened. Values JSON cannot encode are written
with `str()`. `text_delta` events (streamed text) are skipped unless `deltas=True`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tether._errors import InvalidInput
from tether.events import TraceEvent


def event_record(event: TraceEvent, run_id: str | None = None, now: float | None = None) -> dict[str, Any]:
    """The JSON object written for one event."""
    record: dict[str, Any] = {"time": round(time.time() if now is None else now, 6)}
    if run_id is not None:
        record["run_id"] = run_id
    record.update(kind=event.kind, step=event.step, t=round(event.t, 6), duration=round(event.duration, 6),
                  data=event.data)
    return record


class JsonlTraceWriter:
    """Appends events to a JSONL file (truncated on open unless `append=True`).

    `run_id` is written on every line when set; set it before each run to keep several runs
    (the turns of a chat) apart in one file.
    """

    def __init__(self, path: str | Path, *, append: bool = False, run_id: str | None = None,
                 deltas: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.deltas = deltas
        self.lines = 0
        self._clock = clock
        self._fh: IO[str] | None = self.path.open("a" if append else "w", encoding="utf-8")

    def __call__(self, event: TraceEvent) -> None:
        if self._fh is None:
            raise InvalidInput(f"trace file {self.path} is closed")
        if event.kind == "text_delta" and not self.deltas:
            return
        line = json.dumps(event_record(event, self.run_id, self._clock()), ensure_ascii=False, default=str)
        self._fh.write(line + "\n")
        self._fh.flush()
        self.lines += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonlTraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """Parse a JSONL trace file back into a list of records."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


__all__ = ["JsonlTraceWriter", "event_record", "read_trace"]
