"""Acting on durable runs from another process: approve or deny a parked call, cancel a run.

These talk to the database only (a DBOS client and the run store): they never launch DBOS, so
they never adopt or run anyone's workflows."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Protocol

from dbos import DBOSClient, DBOSPortableJSONSerializer

from tether._errors import TetherError
from tether.durable._runner import APPROVAL_TOPIC
from tether.store._sql import RunStore, engine_url

FINISHED = ("completed", "stopped", "error", "cancelled")


class ControlError(TetherError):
    """A request that cannot be carried out (one line for the user)."""


def _client(url: str) -> DBOSClient:
    return DBOSClient(system_database_url=url.replace("postgresql+psycopg://", "postgresql://", 1),
                      serializer=DBOSPortableJSONSerializer())


def _find(store: RunStore, url: str, run_id: str) -> Any:
    row = store.run(run_id)
    if row is None:
        raise ControlError(f"no run {run_id!r} in {url}")
    return row


class Messenger(Protocol):
    """What acting on a run needs of DBOS: a `DBOSClient` (another process) or the launched `DBOS`."""

    def send(self, destination_id: str, message: Any, topic: str | None = None) -> None: ...

    def cancel_workflow(self, workflow_id: str) -> None: ...

    def list_workflows(self, *, status: list[str] | None = None, workflow_id_prefix: str | None = None) -> list[Any]: ...


def approve(database: str | os.PathLike[str] | None, run_id: str, call_id: str, *, approved: bool = True,
            by: str | None = None, reason: str = "", batch: bool = False) -> dict[str, Any]:
    """Decide the call `call_id` a parked run waits on; the run then executes exactly that call (or
    hands the denial to the model). With `batch`, the one decision answers every call of the pending
    call's batch (each bound to its own arguments), as the task service's confirm does. Returns the
    pending call that was decided (its batch's calls under `batch_calls`)."""
    with _connected(database) as (store, client):
        group = ""
        if batch:
            row = _find(store, store.url, run_id)
            pending = row.pending or {}
            if row.status == "awaiting_approval" and pending.get("call_id") == call_id:
                group = str(pending.get("batch") or "")
                if not group:
                    raise ControlError(f"call {call_id} of run {run_id} is not part of a batch; decide it alone "
                                       "(without --batch)")
        return decide(store, client, run_id, call_id, approved=approved, by=by, reason=reason, batch=group)


def cancel(database: str | os.PathLike[str] | None, run_id: str) -> str:
    """Cancel a run: it ends at its next step boundary (a parked run at once). Returns its status before."""
    with _connected(database) as (store, client):
        return cancel_run(store, client, run_id)


def decide(store: RunStore, dbos: Messenger, run_id: str, call_id: str, *, approved: bool = True,
           by: str | None = None, reason: str = "", batch: str = "") -> dict[str, Any]:
    """`approve` over an open store and DBOS (the task service's own, in its process); with `batch`
    (the pending call's batch id), the one decision answers every call of that batch."""
    row = _find(store, store.url, run_id)
    if row.status == "decided":
        raise ControlError(f"call {call_id} of run {run_id} is already decided")
    if row.status != "awaiting_approval" or not row.pending:
        raise ControlError(f"run {run_id} is {row.status}, not awaiting an approval")
    if row.pending.get("call_id") != call_id:
        raise ControlError(f"run {run_id} awaits call {row.pending.get('call_id')!r}, not {call_id!r}")
    pending = row.pending
    # "decided" before the message goes out (the run's process may take it, and park again, at once),
    # as one conditional write: of two answers to the same call only one gets past here
    if not store.claim_decision(run_id, pending):
        raise ControlError(f"call {call_id} of run {run_id} is already decided")
    try:
        dbos.send(run_id, {"call_id": call_id, "step": pending.get("step"), "approved": approved,
                           "by": by or _whoami(), "reason": reason, **({"batch": batch} if batch else {})},
                  APPROVAL_TOPIC)
    except BaseException:
        store.set_status(run_id, "awaiting_approval", pending=pending)
        raise
    return pending


def cancel_run(store: RunStore, dbos: Messenger, run_id: str) -> str:
    """`cancel` over an open store and DBOS."""
    row = _find(store, store.url, run_id)
    if row.status in FINISHED:
        raise ControlError(f"run {run_id} already ended ({row.status})")
    if row.status == "awaiting_approval":
        dbos.send(run_id, {"cancel": True}, APPROVAL_TOPIC)  # wakes the parked run
    dbos.cancel_workflow(run_id)
    # DBOS abandons a cancelled workflow's execution, so its process may never write the end
    store.set_status(run_id, "cancelled")
    cancel_children(store, dbos, run_id)
    return row.status


def cancel_children(store: RunStore, dbos: Messenger, run_id: str) -> None:
    """Cancel the unfinished sub-agent runs under `run_id`, at any depth: their ids (and their
    workflows' ids, RUN~N for a later segment) start with the run's id and ":" (a child's run id is
    its parent's call key, run:step:index, plus its name)."""
    for child in dbos.list_workflows(status=["PENDING", "ENQUEUED"], workflow_id_prefix=run_id + ":"):
        dbos.cancel_workflow(child.workflow_id)
        head, _, segment = child.workflow_id.rpartition("~")
        store.set_status(head if segment.isdigit() else child.workflow_id, "cancelled")
    # and the rows of children whose workflow was still starting (a child checks its ancestors when it
    # starts, so one that starts after this stops at once: `ancestor_cancelled`)
    todo = [run_id]
    while todo:
        for row in store.runs(parent=todo.pop(), limit=10_000):
            if row.status not in FINISHED:
                store.set_status(row.run_id, "cancelled")
            todo.append(row.run_id)


def ancestor_cancelled(store: RunStore, run_id: str) -> str | None:
    """The id of a cancelled run above `run_id` (its parent, its parent's parent, ...), if any."""
    row = store.run(run_id)
    seen = {run_id}
    while row is not None and row.parent_run and row.parent_run not in seen:
        seen.add(row.parent_run)
        row = store.run(row.parent_run)
        if row is not None and row.status == "cancelled":
            return row.run_id
    return None


@contextlib.contextmanager
def _connected(database: str | os.PathLike[str] | None) -> Iterator[tuple[RunStore, DBOSClient]]:
    url = engine_url(database)
    store = RunStore(url)
    try:
        client = _client(url)
        try:
            yield store, client
        finally:
            client.destroy()
    finally:
        store.close()


def _whoami() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no user database entry (containers)
        return "unknown"
