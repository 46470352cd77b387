"""Heartbeats and the janitor: a worker that dies has its runs taken over by another.

Open-source DBOS recovers a process's pending workflows only when a process with the same executor id
starts again. So every worker writes a heartbeat, and every worker's janitor looks for workers that
went silent and re-enqueues their pending runs (DBOS recovery re-enqueues, and a run's dequeue admits
exactly one runner, so two janitors adopting the same dead worker is harmless). The adopted runs
continue from their last completed step."""

from __future__ import annotations

import asyncio
import logging

from tether.server.keys import ServiceTables

log = logging.getLogger("tether.server")
BEAT_SECONDS = 2.0
DEAD_AFTER = 10.0


async def heartbeat_and_janitor(tables: ServiceTables, executor_id: str, *, beat: float = BEAT_SECONDS,
                                dead_after: float = DEAD_AFTER) -> None:
    """Runs until cancelled: beat every `beat` s; adopt workers silent for `dead_after` s."""
    from dbos import DBOS

    while True:
        try:
            await asyncio.to_thread(tables.beat, executor_id)
            for dead in await asyncio.to_thread(tables.silent_workers, dead_after, executor_id):
                handles = await asyncio.to_thread(DBOS._recover_pending_workflows, [dead])
                log.warning("worker %s went silent: re-enqueued its %d pending runs", dead, len(handles))
        except asyncio.CancelledError:
            raise
        except Exception:  # the database is briefly away: try again next beat
            log.exception("heartbeat/janitor round failed")
        await asyncio.sleep(beat)
