"""The DBOS names beyond its public API that the task service uses, in one place, each guarded.

Open-source DBOS has no public call to recover another executor's pending workflows, to reach the
process's DBOS object, or to list the workflow tasks it runs; the service needs all three (the
janitor adopts a dead worker's runs; a draining worker cancels its tasks). Each is looked up when
used: a DBOS without it gives one clear error (recovery) or the safe default (no instance, no
tasks), never an AttributeError deep in a stop. tests/test_dbos_private.py checks that the
installed DBOS has every name in `NAMES`, so an upgrade that moves one fails there first. (The
step fast path, `dbos_fastpath`, is separate and opt-in.)
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

from tether._errors import OperationFailed

T = TypeVar("T")

# (module, attribute path) of every private DBOS name used here
NAMES = ("DBOS._recover_pending_workflows", "_dbos_global_instance", "DBOS.background_thread_stop_events",
         "DBOS._workflow_tasks", "_context._dbos_context_var", "_error.DBOSWorkflowCancelledError",
         "_error.DBOSAwaitedWorkflowCancelledError")


def cancelled_errors() -> tuple[type[BaseException], ...]:
    """The exceptions DBOS raises in a workflow that was cancelled (public DBOS exports none): the
    durable runner turns them into a cancelled run. None on a DBOS that moved them; its cancellations
    then end the run as errors, and tests/test_dbos_private.py fails first."""
    try:
        from dbos import _error
    except ImportError:
        return ()
    found = (getattr(_error, name, None) for name in ("DBOSWorkflowCancelledError", "DBOSAwaitedWorkflowCancelledError"))
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, BaseException))


def recover_pending(executor_ids: list[str]) -> list[Any]:
    """Re-enqueue the pending workflows of these executors (what DBOS does for its own at launch)."""
    from dbos import DBOS

    recover = getattr(DBOS, "_recover_pending_workflows", None)
    if recover is None:
        raise OperationFailed("this DBOS version has no _recover_pending_workflows: the janitor cannot adopt a "
                              "dead worker's runs (tether is tested with dbos 3.4)")
    return recover(executor_ids)


def instance() -> Any:
    """The process's DBOS object (None before setup, after destroy, or if DBOS keeps it elsewhere)."""
    from dbos import _dbos

    return getattr(_dbos, "_dbos_global_instance", None)


def stop_background_threads() -> None:
    """Tell DBOS's queue (and scheduler) threads to end, what `DBOS.destroy` does first."""
    dbos = instance()
    for event in getattr(dbos, "background_thread_stop_events", None) or ():
        event.set()


def workflow_tasks(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[Any]]:
    """The unfinished workflow tasks DBOS runs on `loop` (none if it does not say)."""
    dbos = instance()
    tasks = getattr(dbos, "_workflow_tasks", None) if dbos is not None else None
    return [t for t in tasks or () if not t.done() and t.get_loop() is loop]


async def outside_workflow(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` in a task that is not inside this task's workflow or step (every other context
    variable kept): a workflow started there is a top-level one. DBOS refuses to start a workflow
    from inside a step, and a child workflow's place in its parent depends on call order, which
    concurrent tool calls do not keep; a durable sub-agent is started this way, from its parent's
    tool step, under an id derived from that step."""
    from dbos import _context

    var = getattr(_context, "_dbos_context_var", None)
    if var is None:
        raise OperationFailed("this DBOS version keeps its context elsewhere: a durable sub-agent cannot be started "
                              "(tether is tested with dbos 3.4)")
    context = contextvars.copy_context()
    context.run(var.set, None)
    return await asyncio.create_task(work, context=context)
