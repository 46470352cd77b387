"""`DbosStepRunner`: the loop's StepRunner as DBOS steps. Each model call and each tool run is a
checkpointed step; a replay returns the recorded outputs, so the same `run_loop` takes the same
branches. Clock readings are recorded with the steps (the loop reads `RecordedClock`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from dbos import DBOS

from tether._errors import OperationFailed
from tether._limits import ADMITTED, LOST_CALL
from tether._loop import ChildRun, RunCancelled
from tether._types import ModelReply, RunResult, ToolCall, ToolResult, Usage, from_jsonable, to_jsonable
from tether.durable._dbos_private import cancelled_errors
from tether.events import ToolCallStarted, TraceEvent

if TYPE_CHECKING:  # the runtime builds these, passing itself in
    from tether.durable._runtime import Runtime
    from tether.store._sql import RunStore

APPROVAL_TOPIC = "approval"
CANCELLED = cancelled_errors()  # DBOS's own "this workflow was cancelled" exceptions (private names, guarded)
# (parent run id, agent-tool path from the top-level agent, the child) -> the child's result
StartChild = Callable[[str, tuple[str, ...], ChildRun], Awaitable[RunResult[Any]]]


class RecordedClock:
    """Wall-clock seconds as of the last recorded step (the run's start before any): replaying a run
    reads the same times, so its time budget takes the same decisions."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


class DbosStepRunner:
    """Runs one durable run's steps through DBOS (from inside its workflow)."""

    def __init__(self, run_id: str, started_at: float, runtime: Runtime, *, approval_timeout: float,
                 flush: Callable[[], None] | None = None, flush_text: Callable[[], None] | None = None,
                 path: tuple[str, ...] = (), start_child: StartChild | None = None) -> None:
        self.run_id = run_id
        self.path = path  # the agent tools from the top-level run's agent to this run's (() at the top)
        self.start_child = start_child
        self.runtime = runtime
        self.clock = RecordedClock(started_at)
        self.approval_timeout = approval_timeout
        self.flush = flush  # writes the run's new events to the store, once per turn
        self.flush_text = flush_text  # writes the text a model call streamed, before its step is recorded
        self._reserved: dict[int, Any] = {}
        self._model_calls = 0  # this workflow's model steps so far: the same on every replay

    async def run_child(self, parent_run_id: str, child: ChildRun,
                        run: Callable[[], Awaitable[RunResult[Any]]]) -> RunResult[Any]:
        """The sub-agent's run as a durable run of its own (`run` is not used): a workflow of its own,
        checkpointed step by step, stored under its parent (`parent_run`) with its events as they
        happen; the parent's tool step waits for it, so a parent recovered after a crash finds the
        child where it was (its recorded steps are not run again)."""
        if self.start_child is None:
            raise OperationFailed("this durable runner cannot start sub-agents")
        return await self.start_child(parent_run_id, (*self.path, child.name), child)

    def begin_turn(self, step: int, indices: list[int]) -> None:
        # Concurrent tool steps get their ids now, in call order, so a replay matches them up.
        self._reserved = {i: DBOS.reserve_step() for i in indices}

    async def model_step(self, step: int, run: Callable[[], Awaitable[ModelReply]]) -> ModelReply:
        """The call as a step, its admitted maximum written ahead of it (under a token or cost
        ceiling): a step that finds its write-ahead record already there was sent by a process that
        died before recording the reply, so it is not sent again but returned as a LOST_CALL reply
        that uses that maximum (the provider billed it); the loop charges it and admits the call anew."""
        if self.flush is not None:
            self.flush()
        admitted = ADMITTED.get()
        ADMITTED.set(None)
        key = f"tether/sent/{DBOS.workflow_id}/{self._model_calls}"
        self._model_calls += 1

        async def model() -> dict[str, Any]:
            if admitted is not None:
                ledger = self.runtime.store.idempotency()
                if (sent := ledger.get(key)) is not None:
                    inp, out, usd = json.loads(sent)
                    lost = ModelReply(usage=Usage(int(inp), int(out), float(usd)), finish_reason=LOST_CALL)
                    return {"reply": to_jsonable(lost), "at": time.time()}
                ledger.put(key, json.dumps(admitted))  # before the call is sent
            reply = await run()
            if self.flush_text is not None:
                self.flush_text()
            return {"reply": to_jsonable(reply), "at": time.time()}

        out = await self._step(DBOS.run_step_async({"name": "model", "preemptible": True}, model))
        self.clock.at = max(self.clock.at, float(out["at"]))
        return from_jsonable(ModelReply, out["reply"])

    @property
    def job_ledger(self) -> Any:
        """Where a job's idempotency key is written before it runs (tether.tools._jobs): a job found
        there by a recovered run was started by a process that died, and is reported lost, not run again."""
        return self.runtime.store.idempotency()

    def tool_step(self, step: int, index: int, call: ToolCall,
                  run: Callable[[], Awaitable[ToolResult]]) -> Awaitable[ToolResult]:
        # The reserved step id is taken now, not when the step starts: a job's step may start after
        # the next turn has reserved its own.
        return self._tool_step(self._reserved.pop(index, None), call, run)

    async def _tool_step(self, reserved: Any, call: ToolCall, run: Callable[[], Awaitable[ToolResult]]) -> ToolResult:
        async def tool() -> dict[str, Any]:
            result = await run()
            return {"result": to_jsonable(result), "at": time.time()}

        options: Any = {"name": f"tool:{call.name}"}
        work = reserved.run_async(options, tool) if reserved is not None else DBOS.run_step_async(options, tool)
        out = await self._step(work)
        self.clock.at = max(self.clock.at, float(out["at"]))
        return from_jsonable(ToolResult, out["result"])

    async def wait_approval(self, run_id: str, pending: dict) -> dict | None:
        """Park (no thread held: DBOS recv, durable across restarts) until a decision on this call.
        A sub-agent does not park: it stops, and its parent parks on the call in its place."""
        if self.path:
            return None
        store = self.runtime.store
        store.set_status(run_id, "awaiting_approval", pending=pending)
        if self.flush is not None:
            self.flush()
        while True:
            try:
                message = await DBOS.recv_async(APPROVAL_TOPIC, timeout_seconds=self.approval_timeout)
            except CANCELLED as exc:
                raise RunCancelled from exc
            if message is None:
                decision = {"call_id": pending["call_id"], "approved": False, "by": "timeout",
                            "reason": f"no decision within {self.approval_timeout:g} s"}
                break
            if isinstance(message, dict) and message.get("cancel"):
                raise RunCancelled
            # bound to this call at this step: call ids repeat across replies, a stale decision must not match
            if isinstance(message, dict) and message.get("call_id") == pending["call_id"] \
                    and message.get("step") == pending.get("step"):
                decision = message
                break
        store.set_status(run_id, "running")
        return decision

    async def _step(self, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        rt = self.runtime
        if rt.draining:  # the process is stopping: this step runs when the run is recovered, not here
            if asyncio.iscoroutine(work):
                work.close()
            await asyncio.get_running_loop().create_future()  # until the shutdown cancels the run
        rt.steps_in_flight += 1
        try:
            return await work
        except CANCELLED as exc:  # cancelled elsewhere
            raise RunCancelled from exc
        finally:
            rt.steps_in_flight -= 1


TOOL_STARTED = ToolCallStarted.__dataclass_fields__["kind"].default


LIVE_AFTER = 0.25  # seconds: a tool call still running this long has its start written at once


class EventBuffer:
    """The run's events: passed on to the caller's sink (same process) and written to the store
    in one batch per turn (a replay writes the same sequence numbers again, harmlessly), and sooner
    when a tool call is still running `LIVE_AFTER` seconds after it started (a tool may take minutes:
    a reader, the task service's stream, then sees it open; a quick turn costs no extra write). With
    `store_text`, streamed text is written too (tether.durable._text_deltas), for other processes."""

    def __init__(self, run_id: str, sink: Callable[[TraceEvent], None] | None, store: RunStore, *,
                 store_text: bool = False, base: int = 0) -> None:
        from tether.durable._text_deltas import TextDeltaWriter

        self.run_id = run_id
        self.sink = sink
        self.events: list[TraceEvent] = []
        self.flushed = 0
        self.base = base  # the store's seq of this buffer's first event (a sub-agent's next segment goes on after its last)
        self.store = store
        self.text = TextDeltaWriter(self.store, run_id) if store_text else None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None  # the run's task, when the timer was armed

    def __call__(self, event: TraceEvent) -> None:
        if event.kind != "text_delta":
            self.events.append(event)
            if event.kind == TOOL_STARTED and self._timer is None:
                self._task = asyncio.current_task()
                self._timer = asyncio.get_running_loop().call_later(LIVE_AFTER, self._flush_later)
        elif self.text is not None:
            self.text.add(self.base + len(self.events), str(event.data.get("text", "")))
        if self.sink is not None:
            self.sink(event)

    def flush_text(self) -> None:
        if self.text is not None:
            self.text.flush()

    def _flush_later(self) -> None:
        self._timer = None
        if self._task is not None and self._task.cancelling():
            return  # the process is stopping the run: what it emits while ending is not the run's (abandon)
        self.flush()

    def abandon(self) -> None:
        """The process stopped the run (it stays pending, to be recovered): nothing more is written."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        del self.events[self.flushed:]

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush_text()
        if self.flushed < len(self.events):
            self.store.add_events(self.run_id, self.events[self.flushed:], self.base + self.flushed)
            self.flushed = len(self.events)
