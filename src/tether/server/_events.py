"""A task's server-sent events, derived from what its run stored: its events and its streamed text.

Every SSE event is a pure function of stored rows (and, for `answer`, the stored outcome), so a client
that reconnects with `Last-Event-ID` gets exactly the events after the one it saw: no gap, no
duplicate, whether the server restarted meanwhile or the run finished. Ids are `SEQ.K`: the K-th SSE
event of stored event SEQ, where the text a model call streamed (`text_delta`) comes first, under the
seq of the event that call ends with. Rows are only ever added, so an event's id never changes.

One `Feed` per process watches every open stream's run with one query per tick, and wakes only the
streams whose run changed (200 streams cost one query, not 200).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from tether._errors import InvalidType
from tether._types import CallDecision
from tether.events import (
    ApprovalDecided,
    ApprovalRequested,
    BaseEvent,
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
    stored,
)
from tether.store._sql import RunStore

log = logging.getLogger("tether.server")
TICK_SECONDS = 0.1
IDLE_RECHECK_SECONDS = 5.0  # a stream re-reads this often even unwoken (belt and braces)
ENDED = ("cancelled", "error")  # statuses a run can end in without storing a stop event
FINISHED = ("completed", "stopped", *ENDED)

SseItem = tuple[str, dict[str, Any]]
Call = Callable[..., Awaitable[Any]]
RUN_ROW = "SELECT status, stop_reason, answer FROM tether_runs WHERE run_id = :r"


def derive(event: BaseEvent, answer: str | None) -> list[SseItem]:
    """The SSE events (name, data) one stored event stands for (after its streamed text). Each is
    named by its kind (`tool_call_started`, `tool_call`, ...) and carries its typed payload; a
    pending approval adds `confirm_request` and a status, the stop adds the answer first."""
    match event:
        case ToolCallEnded(decision=CallDecision.AWAITING_APPROVAL):
            return [(event.kind, event.data),
                    ("confirm_request", {"call_id": event.call_id, "tool": event.name, "arguments": event.arguments}),
                    ("status", {"status": "awaiting_approval"})]
        case ApprovalDecided():
            return [("status", {"status": "running", "approval": event.data})]
        case Notice(notice={"approval": approval}):  # runs stored before approval_decided existed
            return [("status", {"status": "running", "approval": approval})]
        case ApprovalRequested(batch=batch) if batch:  # one question for the calls of its turn
            return [("confirm_batch", {"call_id": event.call_id, "batch": batch, "batch_summary": event.batch_summary})]
        case ApprovalRequested():
            return []  # confirm_request, derived from the tool_call, announces it
        case RunStopped():
            return [("answer", {"answer": answer or "", "stop_reason": event.stop_reason}), (event.kind, event.data)]
        case (RunStarted() | ModelCallStarted() | ModelCallEnded() | ToolCallStarted() | ToolCallEnded() | Notice()
              | Error() | CriticReviewed() | TextStreamed() | FilterVerdict() | JobStarted() | JobEnded()):
            return [(event.kind, event.data)]
    raise InvalidType(f"an event type the stream does not handle: {type(event).__name__}")


HANDLED = (RunStarted, ModelCallStarted, ModelCallEnded, ToolCallStarted, ToolCallEnded, ApprovalRequested,
           ApprovalDecided, Notice, Error, RunStopped, CriticReviewed, TextStreamed, FilterVerdict, JobStarted,
           JobEnded)


def stored_event(kind: str, data: dict[str, Any]) -> BaseEvent:
    """A stored row as its typed event (a kind this version does not know: a notice with its data)."""
    return stored(TraceEvent(kind, 0, 0.0, 0.0, data))


def timed(items: list[SseItem], event: BaseEvent) -> list[SseItem]:
    """`items` with the event's step, run time and duration added to each payload (the console's
    stream shows latency; the API's payloads stay the typed events' own)."""
    at = {"step": event.step, "t": event.t, "duration": event.duration}
    return [(name, {**payload, **at}) for name, payload in items]


def text_item(text: str, restart: bool) -> SseItem:
    """A `text_delta`; `restart`: the model call began again, so drop the text since the last event."""
    return ("text_delta", {"text": text, "restart": True} if restart else {"text": text})


def parse_last_id(value: str | None) -> tuple[int, int]:
    """(seq, k) of the last event the client saw; (-1, 0) for none. A malformed id starts over."""
    if not value:
        return -1, 0
    head, _, tail = value.partition(".")
    try:
        return int(head), int(tail or 0)
    except ValueError:
        return -1, 0


@dataclass(slots=True)
class Read:
    """What one stream read: stored events and text pieces from its cursor on, and the run's row."""

    events: list[tuple[int, TraceEvent]]
    texts: list[tuple[int, int, str, bool]]
    status: str | None
    stop_reason: str | None
    answer: str | None


def read_from(store: RunStore, run_id: str, seq: int, idx: int) -> Read:
    """Events at `seq` and after, text pieces at (seq, idx) and after, and the run's status."""
    with store.engine.connect() as conn:
        row = conn.execute(sa.text(RUN_ROW), {"r": run_id}).first()  # first: a run that ended stored its events before
        events = [(int(q), TraceEvent(k, int(st or 0), float(t or 0.0), float(du or 0.0), json.loads(d)))
                  for q, k, st, t, du, d in conn.execute(sa.text(
                      "SELECT seq, kind, step, t, duration, data FROM tether_events WHERE run_id = :r AND seq >= :s "
                      "ORDER BY seq"), {"r": run_id, "s": seq})]
        texts = [(int(q), int(i), x, bool(re)) for q, i, x, re in conn.execute(sa.text(
            "SELECT seq, idx, text, restart FROM tether_text_deltas WHERE run_id = :r AND "
            "(seq > :s OR (seq = :s AND idx >= :i)) ORDER BY seq, idx"), {"r": run_id, "s": seq, "i": idx})]
        if any(e.kind == "stop" for _, e in events):  # stored with its outcome: read that now
            row = conn.execute(sa.text(RUN_ROW), {"r": run_id}).first()
    return Read(events, texts, *(row if row is not None else (None, None, None)))


class Feed:
    """Wakes the streams whose run changed: one query per tick over every watched run."""

    def __init__(self, store: RunStore, call: Call | None = None, tick: float = TICK_SECONDS) -> None:
        self.store = store
        self.call: Call = call or asyncio.to_thread  # how blocking reads run (the service's own threads)
        self.tick = tick
        self._watchers: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._marks: dict[str, tuple[Any, ...]] = {}
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever `run_id`'s stored events, text or status change."""
        woken = asyncio.Event()
        self._watchers[run_id].add(woken)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._poll())
        try:
            yield woken
        finally:
            self._watchers[run_id].discard(woken)
            if not self._watchers[run_id]:
                del self._watchers[run_id]
                self._marks.pop(run_id, None)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _poll(self) -> None:
        while self._watchers:
            try:
                marks = await self.call(self._read_marks, list(self._watchers))
            except Exception:  # the database is briefly away: the streams' idle re-reads carry on
                log.exception("event feed: reading the watched runs failed")
                marks = {}
            for run_id, mark in marks.items():
                if self._marks.get(run_id) != mark and run_id in self._watchers:
                    self._marks[run_id] = mark
                    for woken in self._watchers[run_id]:
                        woken.set()
            await asyncio.sleep(self.tick)

    def _read_marks(self, run_ids: list[str]) -> dict[str, tuple[Any, ...]]:
        out: dict[str, tuple[Any, ...]] = {}
        with self.store.engine.connect() as conn:
            for start in range(0, len(run_ids), 500):
                chunk = run_ids[start:start + 500]
                params = {f"r{i}": r for i, r in enumerate(chunk)}
                marks = ", ".join(f":r{i}" for i in range(len(chunk)))
                for run_id, *mark in conn.execute(sa.text(
                    "SELECT r.run_id, r.status, "
                    " (SELECT MAX(e.seq) FROM tether_events e WHERE e.run_id = r.run_id),"
                    " (SELECT d.seq FROM tether_text_deltas d WHERE d.run_id = r.run_id ORDER BY d.seq DESC, d.idx DESC LIMIT 1),"
                    " (SELECT d.idx FROM tether_text_deltas d WHERE d.run_id = r.run_id ORDER BY d.seq DESC, d.idx DESC LIMIT 1)"
                    f" FROM tether_runs r WHERE r.run_id IN ({marks})"), params):
                    out[run_id] = tuple(mark)
        return out


def _sse(seq: int, k: int, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"{seq}.{k}", "event": name, "data": json.dumps(payload, ensure_ascii=False, default=str)}


def settle_end(store: RunStore, run_id: str, status: str, stop_reason: str | None) -> int:
    """The seq of a finished run's stop event. A run that ended without one (cancelled while queued or
    parked: DBOS lets no interrupted workflow record its end) gets one stored after its last event;
    keyed by seq like every event, so if the run stored its own event there first this changes nothing,
    and every reader sees the same sequence."""
    with store.engine.connect() as conn:
        last, stop = conn.execute(sa.text("SELECT MAX(seq), MAX(CASE WHEN kind = 'stop' THEN seq END) "
                                          "FROM tether_events WHERE run_id = :r"), {"r": run_id}).one()
    if stop is not None:
        return int(stop)
    seq = -1 if last is None else int(last)
    store.add_events(run_id, [RunStopped(stop_reason=stop_reason or status).envelope()], seq + 1)
    return seq + 1


async def stream(store: RunStore, feed: Feed, task_id: str, last_event_id: str | None, *,
                 timing: bool = False) -> AsyncIterator[dict[str, Any]]:
    """SSE events for sse-starlette: {"id", "event", "data"} after `last_event_id`, until the stop
    (`timing`: each stored event's items carry its step, t and duration too)."""
    seen_seq, seen_k = parse_last_id(last_event_id)
    # the cursor: the stored event being derived, and how many of its SSE events are out
    seq, k = (seen_seq, seen_k + 1) if seen_seq >= 0 else (0, 0)
    texts: list[SseItem] = []  # the text pieces of `seq` read so far
    with feed.watch(task_id) as woken:
        while True:
            woken.clear()
            got = await feed.call(read_from, store, task_id, seq, len(texts))
            rows = dict(got.events)
            later: dict[int, list[SseItem]] = defaultdict(list)
            for q, _, text, restart in got.texts:
                (texts if q == seq else later[q]).append(text_item(text, restart))
            while seq in rows or texts:
                # "running" first for the run's first event, then the text its model call streamed, then its own
                items: list[SseItem] = [("status", {"status": "running"})] if seq == 0 else []
                items += texts
                if seq in rows:
                    event = stored(rows[seq])
                    derived = derive(event, got.answer if isinstance(event, RunStopped) else None)
                    items += timed(derived, event) if timing else derived
                for n in range(k, len(items)):
                    yield _sse(seq, n, *items[n])
                k = max(k, len(items))
                if seq not in rows:
                    break  # the rest once the model call ends
                if rows[seq].kind == "stop":
                    return
                seq, k, texts = seq + 1, 0, later.pop(seq + 1, [])
            if got.status in FINISHED and seq not in rows and not texts:
                end = await feed.call(settle_end, store, task_id, got.status, got.stop_reason)
                if seq > end:
                    return  # the client is past the end (an id from elsewhere): nothing more will come
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), IDLE_RECHECK_SECONDS)
