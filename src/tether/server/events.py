"""A task's server-sent events, derived from the events its run stored.

Every SSE event is a pure function of the stored events (and, for `answer`, the stored outcome), so a
client that reconnects with `Last-Event-ID` gets exactly the events after the one it saw: no gap, no
duplicate, whether the server restarted meanwhile or the run finished. Ids are `SEQ.K`: the K-th SSE
event derived from stored event SEQ. (Text deltas are not stored, so they are not part of the stream.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import sqlalchemy as sa

from tether.server.tasks import Tasks

POLL_SECONDS = 0.2


def derive(seq: int, kind: str, data: dict[str, Any], answer: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events (name, data) one stored event stands for."""
    out: list[tuple[str, dict[str, Any]]] = []
    if seq == 0:
        out.append(("status", {"status": "running"}))
    if kind == "tool_call":
        out.append(("tool_call", data))
        if data.get("decision") == "awaiting_approval":
            out.append(("confirm_request", {"call_id": data.get("call_id"), "tool": data.get("name"),
                                            "arguments": data.get("arguments")}))
            out.append(("status", {"status": "awaiting_approval"}))
    elif kind == "notice" and "approval" in data:
        out.append(("status", {"status": "running", "approval": data["approval"]}))
    elif kind == "stop":
        out.append(("answer", {"answer": answer or "", "stop_reason": data.get("stop_reason")}))
        out.append(("stop", data))
    elif kind in ("model_call", "error"):
        out.append((kind, data))
    else:
        out.append(("notice", data))
    return out


def parse_last_id(value: str | None) -> tuple[int, int]:
    """(seq, k) of the last event the client saw; (-1, 0) for none. A malformed id starts over."""
    if not value:
        return -1, 0
    head, _, tail = value.partition(".")
    try:
        return int(head), int(tail or 0)
    except ValueError:
        return -1, 0


def _stored_after(engine: sa.Engine, run_id: str, seq: int) -> list[tuple[int, str, dict[str, Any]]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT seq, kind, data FROM tether_events WHERE run_id = :r AND seq > :s "
                                    "ORDER BY seq"), {"r": run_id, "s": seq})
        return [(int(q), k, json.loads(d)) for q, k, d in rows]


async def stream(tasks: Tasks, task_id: str, last_event_id: str | None) -> AsyncIterator[dict[str, Any]]:
    """SSE events for sse-starlette: {"id", "event", "data"} after `last_event_id`, until the stop."""
    assert tasks.rt is not None
    engine = tasks.rt.store.engine
    seen_seq, seen_k = parse_last_id(last_event_id)
    # the stored event the client was in the middle of is read again, its first events skipped
    cursor = seen_seq - 1 if seen_seq >= 0 else -1
    while True:
        rows = await asyncio.to_thread(_stored_after, engine, task_id, cursor)
        for seq, kind, data in rows:
            answer = None
            if kind == "stop":
                row = await asyncio.to_thread(tasks.rt.store.run, task_id)
                answer = row.answer if row is not None else None
            for k, (name, payload) in enumerate(derive(seq, kind, data, answer)):
                if (seq, k) <= (seen_seq, seen_k):
                    continue
                yield {"id": f"{seq}.{k}", "event": name, "data": json.dumps(payload, ensure_ascii=False, default=str)}
            cursor = seq
            if kind == "stop":
                return
        row = await asyncio.to_thread(tasks.rt.store.run, task_id)
        if row is not None and row.status in ("cancelled", "error") and not rows:
            # ended without a stop event (cancelled while queued or parked): say so once, then end
            if (cursor + 1, 0) > (seen_seq, seen_k):
                yield {"id": f"{cursor + 1}.0", "event": "stop",
                       "data": json.dumps({"stop_reason": row.stop_reason or row.status, "status": row.status})}
            return
        await asyncio.sleep(POLL_SECONDS)
