"""Tasks: durable runs started for a user through the service, queued for the workers.

A task is a durable run (tether.durable) whose workflow is enqueued on one DBOS queue; any process
listening on that queue (`tether serve --workers N`, `tether worker`) runs it. The run store holds
its status, events and outcome; the API reads them from there, so it answers the same after a
restart and from any machine on the same database.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tether._errors import TetherError
from tether.server._keys import ServiceTables
from tether.server._registry import Registry, RegistryError

T = TypeVar("T")
QUEUE = "tether-tasks"
ACTIVE = ("pending", "running", "awaiting_approval")


class TaskError(TetherError):
    """A request the service refuses: `status` is the HTTP status, the message says what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ServiceConfig:
    """How the service runs. `workers`: tasks this process runs at once (0: API only);
    `grace_seconds`: how long the steps in flight get to finish when the process stops;
    `cors_origins`: the origins (scheme://host[:port]) whose web pages may call the API."""

    database: str | None = None
    workers: int = 4
    global_concurrency: int | None = None
    max_prompt_chars: int = 100_000
    max_body_bytes: int = 1_000_000
    submissions_per_minute: int = 60
    max_active_per_user: int = 20
    executor_id: str | None = None
    approval_timeout: float = 7 * 86_400.0
    grace_seconds: int = 10
    cors_origins: tuple[str, ...] = ()  # web pages on these origins may call the API from a browser


@dataclass
class Tasks:
    """Submit, read, confirm and cancel tasks. One per process (DBOS is one per process)."""

    config: ServiceConfig
    registry: Registry
    rt: Any = None
    tables: ServiceTables | None = None
    queue: Any = None
    feed: Any = None  # tether.server._events.Feed: wakes the open event streams
    _janitor: asyncio.Task[None] | None = None
    _deadline: float | None = None  # monotonic time the grace period ends (set by begin_drain)
    drained: Drained | None = None  # how `stop` went
    # The requests' blocking store calls run here, not on the default pool, which DBOS uses for every
    # step it records: a burst of requests must not queue ahead of the runs' own checkpoints.
    _io: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(16, thread_name_prefix="tether-api"))
    _secrets: dict[str, bytes] = field(default_factory=dict)

    async def secret(self, name: str) -> bytes:
        """The service's secret `name` (from the database; fixed once made, so read once)."""
        if name not in self._secrets:
            assert self.tables is not None
            self._secrets[name] = await self.db(self.tables.secret, name)
        return self._secrets[name]

    async def db(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` (a blocking store call) on the service's own threads."""
        return await asyncio.get_running_loop().run_in_executor(self._io, functools.partial(fn, *args, **kwargs))

    async def start(self) -> None:
        """Set DBOS up, register the agents and the queue, launch (recovering this executor's runs)."""
        from dbos import DBOS

        from tether.durable import Durable, attach, setup

        self.rt = rt = setup(Durable(self.config.database, approval_timeout=self.config.approval_timeout,
                                     executor_id=self.config.executor_id or _executor_id()))
        from tether.server._events import Feed

        self.tables = ServiceTables(rt.store.engine)
        self.feed = Feed(rt.store, self.db)
        rt.store_text = True  # the event streams show text as the model writes it

        def factory_for(name: str):
            def build(config: dict[str, Any]) -> Any:
                agent = self.registry.build(name, config.get("user"), config.get("limits"), config.get("task_id"))
                attach(agent, rt.config)  # capped results in the run store
                rt.agents.pop(name, None)  # built per user and limits, so looked up through the factory
                return agent
            return build

        for name in self.registry.names():
            rt.factories[name] = factory_for(name)
        if self.config.workers <= 0:
            DBOS.listen_queues([])  # this process only enqueues
        rt.launch()
        slots = max(1, self.config.workers)
        if self.config.global_concurrency is not None:  # DBOS refuses a worker limit above the global one
            slots = min(slots, self.config.global_concurrency)
        self.queue = await DBOS.register_queue_async(QUEUE, worker_concurrency=slots,
                                                     global_concurrency=self.config.global_concurrency,
                                                     polling_interval_sec=0.2, on_conflict="always_update")
        if self.config.workers > 0:
            from tether.server._janitor import heartbeat_and_janitor

            self._janitor = asyncio.ensure_future(heartbeat_and_janitor(self.tables, rt.config.executor_id or "local"))  # DBOS's default id

    # -- submit ----------------------------------------------------------------------------------

    async def submit(self, user: str, body: dict[str, Any], idempotency_key: str | None = None) -> tuple[str, bool]:
        """Start a task; (task id, created). A retried request with the same Idempotency-Key gets the
        same task (and a different body under the same key is refused)."""
        assert self.tables is not None
        prompt = body["prompt"]
        if len(prompt) > self.config.max_prompt_chars:
            raise TaskError(413, f"the prompt has {len(prompt)} characters; at most {self.config.max_prompt_chars}")
        task_id = "t_" + uuid.uuid4().hex[:16]
        if idempotency_key is None:
            return await self._start(user, body, task_id), True
        existing, same, exists = await self.db(self.tables.claim_submission, user, idempotency_key, body, task_id)
        if not same:
            raise TaskError(409, "this Idempotency-Key was used for a different request; use a new key")
        if existing != task_id:
            if not exists:
                raise TaskError(409, "a request with this Idempotency-Key is still being handled; retry in a moment")
            return existing, False
        try:
            return await self._start(user, body, task_id), True
        except BaseException:  # refused or failed: the key is free for the retry (nothing was created)
            await self.db(self.tables.release_submission, user, idempotency_key, task_id)
            raise

    async def _start(self, user: str, body: dict[str, Any], task_id: str) -> str:
        """Check the user's limits, create the run and enqueue it."""
        from dbos import SetWorkflowID

        from tether._types import to_jsonable
        from tether.durable._runtime import run_workflow

        assert self.rt is not None and self.tables is not None
        staged = body["agent"] in self.registry.staged  # the task writes its own staged copy of the workspace
        try:
            agent = self.registry.build(body["agent"], user, body.get("limits"), task_id if staged else None)
        except RegistryError as exc:
            raise TaskError(422, str(exc)) from exc
        state = agent.start_state(body["prompt"], run_id=task_id)
        config = {"user": user, "limits": body.get("limits") or None, "metadata": body.get("metadata") or {}}
        if staged:
            config["task_id"] = task_id
        await self.db(self._admit, user, task_id, body, config)
        try:
            with SetWorkflowID(task_id):
                await self.queue.enqueue_async(run_workflow, {"agent": body["agent"], "state": to_jsonable(state),
                                                              "started_at": time.time()})
        except Exception:
            await self.db(self.rt.store.set_status, task_id, "error")
            raise
        return task_id

    def _admit(self, user: str, task_id: str, body: dict[str, Any], config: dict[str, Any]) -> None:
        """The user's limits, then the run's row (blocking: one trip to the I/O threads for all three)."""
        assert self.rt is not None and self.tables is not None
        active = self.tables.active_tasks(user, ACTIVE)
        if active >= self.config.max_active_per_user:
            raise TaskError(429, f"you have {active} tasks in progress (at most {self.config.max_active_per_user}); "
                                 "wait for one to finish or cancel one")
        wait = self.tables.take_submission(user, self.config.submissions_per_minute)
        if wait is not None:
            raise TaskError(429, f"at most {self.config.submissions_per_minute} tasks a minute; retry in {wait:.0f} s")
        # the run's row before the enqueue: a worker may take the task at once, and builds its agent from this config
        self.rt.store.create_run(task_id, body["agent"], user, body["prompt"], config=config)

    # -- read --------------------------------------------------------------------------------------

    async def get(self, user: str, task_id: str) -> Any:
        """The task's row, if it is this user's (another user's task does not exist for them)."""
        assert self.rt is not None
        row = await self.db(self.rt.store.run, task_id)
        if row is None or row.user != user:
            raise TaskError(404, f"no task {task_id}")
        return row

    async def list(self, user: str, status: str | None, limit: int, before: float | None,
                   agent: str | None = None) -> list[Any]:
        assert self.rt is not None
        return await self.db(self.rt.store.runs, user=user, status=status, limit=limit, before=before, agent=agent)

    # -- act -----------------------------------------------------------------------------------------

    async def confirm(self, user: str, task_id: str, call_id: str, approved: bool, reason: str, *,
                      batch: bool = False) -> dict[str, Any]:
        """Decide the call the task waits on; exactly that call, exactly once (with `batch`, every call of
        its batch, each bound to its own arguments)."""
        from dbos import DBOS

        from tether.durable._control import ControlError, decide

        assert self.tables is not None and self.rt is not None
        row = await self.get(user, task_id)
        if row.status != "awaiting_approval" or not row.pending:
            raise TaskError(409, f"task {task_id} is {row.status}, not waiting for a confirmation")
        if row.pending.get("call_id") != call_id:
            raise TaskError(409, f"task {task_id} waits on call {row.pending.get('call_id')!r}, not {call_id!r}")
        if batch and not row.pending.get("batch"):
            raise TaskError(409, f"call {call_id} of task {task_id} is not part of a batch; confirm it alone")
        # keyed by the exact pending call: call ids are unique only within one model reply
        key = f"{row.pending.get('step')}:{call_id}"
        if not await self.db(self.tables.record_decision, task_id, key, approved, user, reason):
            raise TaskError(409, f"call {call_id} of task {task_id} was already answered")
        try:
            return await self.db(decide, self.rt.store, DBOS, task_id, call_id, approved=approved, by=user,
                                 reason=reason, batch=str(row.pending["batch"]) if batch else "")
        except ControlError as exc:
            await self.db(self.tables.forget_decision, task_id, key)
            raise TaskError(409, str(exc)) from exc

    # -- staged changes ------------------------------------------------------------------------------

    async def stage(self, user: str, task_id: str, *, finished: bool = False) -> Any:
        """The task's staged copy of its workspace (404 when the task is not this user's or stages
        nothing; with `finished`, 409 while the task still runs)."""
        from tether._errors import NotFound
        from tether.staging import StagedWorkspace

        row = await self.get(user, task_id)
        if finished and row.status in ACTIVE:
            raise TaskError(409, f"task {task_id} is {row.status}; its changes can be applied once it has ended")
        try:
            return await self.db(StagedWorkspace.open, task_id)
        except NotFound:
            raise TaskError(404, f"task {task_id} has no staged changes (its agent does not stage)") from None

    async def changes(self, user: str, task_id: str) -> dict[str, Any]:
        stage = await self.stage(user, task_id)

        def read() -> dict[str, Any]:
            pending = stage.pending()
            return {"task_id": task_id, "status": stage.status, "workspace": str(stage.workspace),
                    "changes": [change_json(c) for c in pending], "diff": stage.diff([c.path for c in pending])
                    if pending else ""}
        return await self.db(read)

    async def apply(self, user: str, task_id: str, paths: list[str] | None) -> dict[str, Any]:
        stage = await self.stage(user, task_id, finished=True)
        try:
            report = await self.db(stage.apply, paths)
        except ValueError as exc:
            raise TaskError(422, str(exc)) from exc
        return {"task_id": task_id, "done": report.done, "skipped": report.skipped, "status": stage.status}

    async def undo(self, user: str, task_id: str) -> dict[str, Any]:
        stage = await self.stage(user, task_id, finished=True)
        try:
            report = await self.db(stage.undo)
        except ValueError as exc:
            raise TaskError(409, str(exc)) from exc
        if report.skipped:
            raise TaskError(409, "nothing undone: changed in the workspace since they were applied: "
                            + ", ".join(sorted(report.skipped)[:10]))
        return {"task_id": task_id, "done": report.done, "skipped": {}, "status": stage.status}

    async def discard(self, user: str, task_id: str) -> dict[str, Any]:
        stage = await self.stage(user, task_id, finished=True)
        await self.db(stage.discard)
        return {"task_id": task_id, "done": [], "skipped": {}, "status": stage.status}

    async def cancel(self, user: str, task_id: str) -> str:
        from dbos import DBOS

        from tether.durable._control import ControlError, cancel_run

        assert self.rt is not None
        await self.get(user, task_id)
        try:
            was = await self.db(cancel_run, self.rt.store, DBOS, task_id)
        except ControlError as exc:
            raise TaskError(409, str(exc)) from exc
        return was

    # -- stop ------------------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Stop taking work, now: no task is dequeued and no durable step starts from here on (a run
        about to start one parks instead). Idempotent; safe in a signal handler (it only sets flags)."""
        if self._deadline is None:
            self._deadline = time.monotonic() + self.config.grace_seconds
        if self.rt is None:
            return
        self.rt.draining = True
        from tether.durable._dbos_private import stop_background_threads

        stop_background_threads()

    async def stop_taking_work(self) -> None:
        """`begin_drain`, then wait for the queue threads to end (a dequeue under way dispatches its
        tasks first; their first step parks)."""
        self.begin_drain()
        assert self._deadline is not None
        await asyncio.to_thread(_join_queue_threads, min(10.0, max(1.0, self._deadline - time.monotonic())))

    async def stop(self) -> Drained:
        """Drain and stop: take no more work, let the steps in flight finish (model or tool calls,
        checkpointed) until the grace period from `begin_drain` ends, then end every run where it is.
        The runs stay PENDING in DBOS, with nothing recorded in the run store, and continue from their
        last checkpoint when this executor id starts again (or another worker's janitor adopts them);
        a step cut short by the grace period runs again then, with the same idempotency key."""
        await self.stop_taking_work()
        rt, drained = self.rt, Drained()
        if rt is not None and rt.launched:
            assert self._deadline is not None
            while rt.steps_in_flight and time.monotonic() < self._deadline:
                await asyncio.sleep(0.05)
            interrupted = rt.steps_in_flight  # before the cancellation, which ends them
            drained = Drained(left_pending=await _end_workflow_tasks(), interrupted=interrupted)
        if self._janitor is not None:  # beats until here, so no janitor adopts this worker's runs mid-step
            self._janitor.cancel()
            await asyncio.gather(self._janitor, return_exceptions=True)
        from tether.durable._runtime import teardown

        if self.feed is not None:
            self.feed.close()
        self._io.shutdown(wait=False, cancel_futures=True)
        teardown()
        self.drained = drained
        return drained


@dataclass(slots=True)
class Drained:
    """How a `Tasks.stop` went: runs left pending for recovery, and steps the grace period cut short."""

    left_pending: int = 0
    interrupted: int = 0


def change_json(change: Any) -> dict[str, Any]:
    """One staged change as the API shows it."""
    return {"path": change.path, "kind": change.kind, "binary": change.binary, "runs_later": change.runs_later,
            "size_before": None if change.before is None else change.before.size,
            "size_after": None if change.after is None else change.after.size}


def _join_queue_threads(timeout: float) -> None:
    """Wait for DBOS's queue worker threads (named queue-worker-QUEUE) to see their stop event."""
    import threading

    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("queue-worker-"):
            thread.join(max(0.0, deadline - time.monotonic()))


async def _end_workflow_tasks() -> int:
    """Cancel the workflows running on this loop; each ends without recording an outcome (run_workflow
    re-raises the cancellation), so DBOS keeps it PENDING. How many there were."""
    from tether.durable._dbos_private import workflow_tasks

    running = workflow_tasks(asyncio.get_running_loop())
    dbos_log = logging.getLogger("dbos")
    level = dbos_log.level
    dbos_log.setLevel(logging.ERROR)  # not DBOS's warning per task ("Asyncio task cancelled"): expected here
    try:
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=10)
    finally:
        dbos_log.setLevel(level)
    return len(running)


def _executor_id() -> str:
    """Stable per machine and worker slot, so a restarted worker recovers its own runs."""
    import socket

    return os.environ.get("TETHER_EXECUTOR_ID") or f"{socket.gethostname()}-{os.environ.get('TETHER_WORKER', '0')}"
