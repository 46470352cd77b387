"""Heartbeats and the janitor: a worker that dies has its runs taken over by another.

Open-source DBOS recovers a process's pending workflows only when a process with the same executor id
starts again. So every worker writes a heartbeat, and every worker's janitor looks for workers that
went silent and re-enqueues their pending runs (DBOS recovery re-enqueues, and a run's dequeue admits
exactly one runner, so two janitors adopting the same dead worker is harmless). The adopted runs
continue from their last completed step.

A janitor adopts only after its own heartbeats have landed without a gap for `dead_after` seconds:
after a database outage (or a stall of this process) every other worker looks silent, and none is
dead. A worker that was only slow and is adopted anyway loses its runs at its next step: DBOS refuses
the write of an execution that no longer owns its workflow and parks it (so at most the step it was
in runs twice, with the same idempotency key).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tether.server._keys import ServiceTables

log = logging.getLogger("tether.server")
BEAT_SECONDS = 2.0
DEAD_AFTER = 10.0


def _recover(executor_id: str) -> list[Any]:
    from tether.durable._dbos_private import recover_pending

    return recover_pending([executor_id])


async def heartbeat_and_janitor(tables: ServiceTables, executor_id: str, *, beat: float = BEAT_SECONDS,
                                dead_after: float = DEAD_AFTER, recover: Callable[[str], list[Any]] = _recover,
                                clock: Callable[[], float] = time.monotonic,
                                sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Runs until cancelled: beat every `beat` s; adopt workers silent for `dead_after` s."""
    landed = healthy_since = clock()  # the last heartbeat that landed; since when they land without a gap
    while True:
        try:
            await asyncio.to_thread(tables.beat, executor_id)
            now = clock()
            if now - landed > 2 * beat + 1:  # a gap: this process, or the database, was away
                healthy_since = now
            landed = now
            if now - healthy_since >= dead_after:
                for dead in await asyncio.to_thread(tables.silent_workers, dead_after, executor_id):
                    handles = await asyncio.to_thread(recover, dead)
                    log.warning("worker %s went silent: re-enqueued its %d pending runs", dead, len(handles))
        except asyncio.CancelledError:
            raise
        except Exception:  # the database is briefly away: try again next beat
            log.exception("heartbeat/janitor round failed")
        await sleep(beat)
