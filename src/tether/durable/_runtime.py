"""The process's DBOS runtime (DBOS is one per process), the registry of durable agents, and the
one workflow every durable run is: `run_loop` with its StepRunner swapped for DBOS steps."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dbos import DBOS, DBOSConfig, DBOSPortableJSONSerializer, SetWorkflowID

from tether._delegation import AGENT_KEY
from tether._errors import InvalidInput, NotFound, OperationFailed
from tether._limits import Limits
from tether._loop import CancelToken, ChildRun, policy_bound, run_loop
from tether._types import RunResult, RunState, StopReason, Usage, from_jsonable, to_jsonable
from tether.durable._control import ancestor_cancelled, cancel_children
from tether.durable._dbos_private import outside_workflow
from tether.durable._runner import DbosStepRunner, EventBuffer
from tether.events import TraceEvent
from tether.store._sql import RunStore, engine_url, make_engine

APP_VERSION = "tether-durable-1"  # pinned: bump only when the workflow's step sequence changes
DAY = 86_400.0


@dataclass(slots=True)
class Durable:
    """Where and how durable runs are kept.

    `database`: a SQLite path, a `sqlite:///` or `postgresql://` URL, or None for
    `tether.db` under the user's data dir. `approval_timeout`: how long a parked run waits for a
    decision (default 7 days; then the call is denied). `executor_id`: which pending runs this
    process recovers when it starts (DBOS recovers the runs of its own executor id). `fastpath`:
    opt in to tether.durable._dbos_fastpath (leaner step checkpoints through DBOS internals, for the
    reviewed DBOS version only: ~1 ms a step instead of ~4 on SQLite); also `TETHER_DBOS_FASTPATH=1`.
    Off by default: DBOS runs as shipped, through its public API.
    """

    database: str | os.PathLike[str] | None = None
    approval_timeout: float = 7 * DAY
    executor_id: str | None = None
    application_version: str = APP_VERSION
    fastpath: bool = False


@dataclass
class _Local:
    cancel: CancelToken | None = None
    on_event: Callable[[TraceEvent], None] | None = None
    stream_text: bool = False


AgentFactory = Callable[[dict[str, Any]], Any]


@dataclass
class Runtime:
    """DBOS launched over one database, plus the run store in the same database."""

    config: Durable
    url: str
    store: RunStore
    agents: dict[str, Any] = field(default_factory=dict)
    factories: dict[str, AgentFactory] = field(default_factory=dict)
    local: dict[str, _Local] = field(default_factory=dict)
    store_text: bool = False  # write streamed text to the store (the task service shows it live)
    launched: bool = False
    draining: bool = False  # the process is stopping: no new step starts (tether.server._tasks.Tasks.stop)
    steps_in_flight: int = 0
    _built: dict[str, Any] = field(default_factory=dict)

    def launch(self) -> None:
        """Start DBOS: pending runs of this executor are recovered now (their agents must be
        registered first: construct every durable Agent, or register a factory, before this)."""
        if not self.launched:
            DBOS.launch()
            self.launched = True

    def agent_for(self, name: str, run_id: str) -> Any:
        if name in self.agents:
            return self.agents[name]
        if name in self.factories:
            config = self.store.config(run_id) or {}
            key = name + json.dumps(config, sort_keys=True)
            built = self._built.pop(key, None)
            if built is None:
                built = self.factories[name](config)
            self._built[key] = built  # most recent last; the oldest go (a staged agent is one per task)
            while len(self._built) > MAX_BUILT_AGENTS:
                self._built.pop(next(iter(self._built)))
            return built
        raise NotFound(f"no durable agent named {name!r} in this process (construct it with "
                          f"Agent(..., name={name!r}, durable=...) before launching)")


MAX_BUILT_AGENTS = 256  # agents built by factories kept for reuse (per user, limits, and staged task)
_RUNTIME: Runtime | None = None


def runtime() -> Runtime:
    if _RUNTIME is None:
        raise OperationFailed("durable mode is not set up in this process (Agent(..., durable=...) or "
                           "tether.durable.setup())")
    return _RUNTIME


def setup(config: Durable | str | os.PathLike[str] | None = None) -> Runtime:
    """Set DBOS up over `config`'s database (once per process; the same database again is a no-op)."""
    global _RUNTIME
    if not isinstance(config, Durable):
        config = Durable(config)
    url = engine_url(config.database)
    if _RUNTIME is not None:
        if _RUNTIME.url != url:
            raise InvalidInput(f"this process already runs durable runs on {_RUNTIME.url}; one database per process")
        return _RUNTIME
    if config.fastpath or os.environ.get("TETHER_DBOS_FASTPATH") == "1":  # opt-in: patches DBOS internals
        _install_fastpath()  # before DBOS launches: recovered runs take the same path
    engine = make_engine(url)
    store = RunStore(engine=engine)
    dbos_config: DBOSConfig = {
        "name": "tether",
        "system_database_url": _dbos_url(url),
        "application_version": config.application_version,
        "serializer": DBOSPortableJSONSerializer(),  # JSON, not pickle
        "log_level": os.environ.get("TETHER_DBOS_LOG_LEVEL", "WARNING"),
        "notification_listener_polling_interval_sec": 0.1,
    }
    if url.startswith("sqlite"):
        dbos_config["system_database_engine"] = engine  # WAL + synchronous=NORMAL, shared with the store
    if config.executor_id:
        dbos_config["executor_id"] = config.executor_id
    DBOS(config=dbos_config)
    _RUNTIME = Runtime(config, url, store)
    return _RUNTIME


def teardown() -> None:
    """Stop DBOS in this process (tests; a process that is done with durable runs)."""
    global _RUNTIME
    if _RUNTIME is not None:
        DBOS.destroy(destroy_registry=False)
        _RUNTIME.store.close()
        _RUNTIME = None


def _install_fastpath() -> None:
    try:
        from tether.durable import _dbos_fastpath as dbos_fastpath
    except (ImportError, AttributeError) as exc:  # a DBOS whose internals moved: run it as shipped
        logging.getLogger(__name__).warning("DBOS step checkpoints take DBOS's own path (%s)", exc)
        return
    dbos_fastpath.install()


def _dbos_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# -- the workflow ------------------------------------------------------------------------------


@DBOS.workflow(name="tether.run", max_recovery_attempts=100_000)
async def run_workflow(job: dict[str, Any]) -> dict[str, Any]:
    """One durable run. `job`: {"agent": name, "state": RunState, "started_at": wall seconds}; the
    workflow id is the run id. A sub-agent's run (`start_child`) also has "path" (the agent tools
    from the top-level run's agent to its own), "top" (that run's id), "limits" (carved from its
    parent) and "events_from" (its first event's seq); its next segments' workflow ids are
    RUN_ID~N."""
    rt = runtime()
    state = from_jsonable(RunState, job["state"])
    run_id = state.run_id
    path = tuple(job.get("path", ()))
    chain = agents_on(rt.agent_for(job["agent"], job.get("top", run_id)), path)
    agent = chain[-1]
    local = rt.local.get(run_id) or _Local()
    if path and (top := rt.local.get(job.get("top", ""))) is not None:
        local = _Local(cancel=top.cancel)  # a sub-agent stops when its top-level run is cancelled here
    events = EventBuffer(run_id, local.on_event, rt.store, store_text=rt.store_text, base=int(job.get("events_from", 0)))

    async def start_child(parent_run_id: str, child_path: tuple[str, ...], child: ChildRun) -> RunResult:
        return await _start_child(rt, job, parent_run_id, child_path, child)

    runner = DbosStepRunner(run_id, float(job["started_at"]), rt, approval_timeout=rt.config.approval_timeout,
                            flush=events.flush, flush_text=events.flush_text, path=path, start_child=start_child)
    spec = agent._spec(run_id, local.cancel, events, local.stream_text or rt.store_text)
    spec.step_runner = runner
    spec.clock = runner.clock
    if path:  # a sub-agent: its carved limits, its parent's user, its ancestors' capabilities
        spec.limits, spec.user = from_jsonable(Limits, job["limits"]), state.user
        spec.bounds = tuple(b for a in chain[:-1] if (b := policy_bound(a.executor.policy)) is not None)
    cancelled_above = ancestor_cancelled(rt.store, run_id) if path else None
    if cancelled_above is not None:  # started (or recovered) after a run above it was cancelled
        result: RunResult = RunResult(run_id, StopReason.CANCELLED, "", error=f"run {cancelled_above} was cancelled",
                                      state=state)
        rt.store.finish_run(result, first_seq=events.base)
        cancelled: dict[str, Any] = to_jsonable(result)
        return cancelled
    # past pending already (running, parked): a process ran it before and stopped, and this is a
    # recovery, which replays from the start
    row = rt.store.run(run_id)
    spec.recovered = row is not None and row.status != "pending"
    rt.store.set_running(run_id)
    run_steps = getattr(agent, "run_steps", None)  # tether.plan.PlanAgent: the same steps, in plan mode
    result = await (run_steps(spec, state) if run_steps is not None else run_loop(spec, state))
    task = asyncio.current_task()
    if task is not None and task.cancelling() and result.stop_reason is StopReason.CANCELLED:
        # the process is shutting down (DBOS cancels its tasks), not the run: leave it pending, so the
        # next process recovers it, and record nothing
        events.abandon()
        raise asyncio.CancelledError
    if result.stop_reason is StopReason.CANCELLED:  # its sub-agents too: marked first, so a late one stops
        rt.store.set_status(run_id, "cancelled")
        await outside_workflow(asyncio.to_thread(cancel_children, rt.store, DBOS, run_id))
    rt.store.finish_run(result, stored_events=events.flushed, first_seq=events.base)
    out: dict[str, Any] = to_jsonable(result)
    out["trace"] = []  # the events are in the store; the workflow output stays small
    return out


def agents_on(agent: Any, path: tuple[str, ...]) -> list[Any]:
    """The agents from `agent` down `path`, each name an agent tool (`Agent.as_tool`) of the one before."""
    chain = [agent]
    for name in path:
        tool = next((t for t in chain[-1].tools if t.name == name), None)
        child = tool.metadata.get(AGENT_KEY) if tool is not None else None
        if child is None:
            raise NotFound(f"the agent {chain[-1].name!r} has no sub-agent tool {name!r} (a durable sub-agent's run "
                           "is recovered through its parent's agent, which must still have that tool)")
        chain.append(child)
    return chain


async def _start_child(rt: Runtime, job: dict[str, Any], parent_run_id: str, path: tuple[str, ...],
                       child: ChildRun) -> RunResult:
    """Run a sub-agent as a durable run of its own, from its parent's tool step, and wait for its
    result. Its workflow id comes from that step (the child's run id is the parent's idempotency key
    plus the tool's name), so a parent recovered after a crash re-runs the step and finds the child's
    workflow, which DBOS recovers on its own from its last checkpoint: nothing it did is done again."""
    state = child.state
    workflow_id = state.run_id if child.segment == 0 else f"{state.run_id}~{child.segment}"
    rt.store.create_run(state.run_id, child.name, state.user, child.task, parent_run=parent_run_id)
    sub = {"agent": job["agent"], "top": job.get("top", parent_run_id), "path": list(path),
           "state": to_jsonable(state), "started_at": time.time(), "limits": to_jsonable(child.limits),
           "events_from": rt.store.next_seq(state.run_id) if child.segment else 0}

    async def start_and_wait() -> RunResult:
        with SetWorkflowID(workflow_id):  # an existing workflow (a recovered parent's) is waited on, not started
            handle = await DBOS.start_workflow_async(run_workflow, sub)
        return await wait_result(state.run_id, handle)

    return await outside_workflow(start_and_wait())


class DurableRuns:
    """What `Agent(durable=...)` holds: starts its runs as DBOS workflows and waits for them."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def run(self, agent: Any, state: RunState, *, cancel: CancelToken | None = None,
                  on_event: Callable[[TraceEvent], None] | None = None, stream_text: bool = False,
                  config: dict[str, Any] | None = None, parent_run: str | None = None) -> RunResult:
        rt = self.rt
        rt.launch()
        run_id = state.run_id
        prompt = next((m.content for m in reversed(state.messages) if m.role == "user"), "")
        rt.store.create_run(run_id, agent.name, state.user, prompt, config=config, parent_run=parent_run)
        rt.local[run_id] = _Local(cancel, on_event, stream_text)
        try:
            with SetWorkflowID(run_id):
                handle = await DBOS.start_workflow_async(
                    run_workflow, {"agent": agent.name, "state": to_jsonable(state), "started_at": time.time()})
            return await wait_result(run_id, handle)
        finally:
            rt.local.pop(run_id, None)


async def wait_result(run_id: str, handle: Any = None) -> RunResult:
    """The run's RunResult once its workflow ends (from the store when it was cancelled or failed)."""
    try:
        if handle is None:
            handle = await DBOS.retrieve_workflow_async(run_id)
        out = await handle.get_result()
        if isinstance(out, dict):
            return from_jsonable(RunResult, out)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # cancelled or failed workflow: what the store knows
        return stored_result(run_id, f"{type(exc).__name__}: {exc}")
    return stored_result(run_id, "the workflow returned nothing")


def stored_result(run_id: str, why: str) -> RunResult:
    row = runtime().store.run(run_id)
    state = runtime().store.state(run_id)
    if row is None:
        return RunResult(run_id, StopReason.ERROR, "", error=f"no such run ({why})")
    stop = StopReason(row.stop_reason) if row.stop_reason else (
        StopReason.CANCELLED if row.status == "cancelled" else StopReason.ERROR)
    usage = from_jsonable(Usage, row.usage) if row.usage else Usage()
    return RunResult(run_id, stop, row.answer or "", usage=usage, messages=state.messages if state else [],
                     error=row.error or (None if stop is StopReason.COMPLETED else why), steps=row.steps,
                     state=state)
