"""Jobs: a slow tool that runs in the background while the model goes on.

A tool declared with `@tool(job=True)` still goes through the executor (validation, policy,
idempotency key, timeout); instead of holding the turn, its run starts as a job and the call is
answered at once with the job's id. The model checks it with `job_status(job_id)` or waits with
`job_wait(job_id, timeout)`, both added to an agent that has a job tool. A run whose model answers
while a job it has not seen is pending does not end: the loop waits for the job (no model call) and
hands its result to the model (tether._loop).

What the loop branches on is only what a recorded tool result says (`ToolResult.job`, noted by the
executor), so a durable run replays the same way. A job's own run is its tool call's step; a durable
job writes its idempotency key ahead of its run, so a run recovered after its process died finds the
key, reports the job lost, and never runs it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tether._errors import InvalidInput
from tether._types import CallDecision, ToolCall, ToolResult
from tether.tools._base import Tool, ToolContext, tool

RUNNING, DONE, FAILED, CANCELLED, LOST = "running", "done", "failed", "cancelled", "lost"


class Ledger(Protocol):
    """Where a durable job's key is written before it runs (`RunStore.idempotency()`)."""

    def get(self, key: str) -> str | None: ...

    def put(self, key: str, value: str) -> None: ...


@dataclass(slots=True, frozen=True)
class JobNote:
    """What `job_status`/`job_wait` return: the text for the model, whether the job's output is
    untrusted (its tool's declaration), and the job's record as the model now knows it."""

    text: str
    untrusted: bool
    job: dict[str, Any]


def is_job(tool: Any) -> bool:
    return bool(getattr(tool, "metadata", {}).get("job"))


def job_id(step: int, index: int) -> str:
    """A job's id: the step and index of the call that started it (its key is run:step:index)."""
    return f"J{step}-{index}"


class Jobs:
    """One run's jobs. `records` is `RunState.jobs` (JSON-safe, one dict per job: id, tool,
    arguments, call_id, key, status, seen, result, is_error); `_tasks` the ones running here."""

    def __init__(self, records: list[dict[str, Any]], *, ledger: Ledger | None = None,
                 emit: Callable[[str, dict[str, Any]], None] | None = None,
                 seconds_left: Callable[[], float | None] | None = None) -> None:
        self.records = records
        self.ledger = ledger
        self.emit = emit
        self.seconds_left = seconds_left
        self.untrusted: dict[str, bool] = {}
        self._tasks: dict[str, asyncio.Task[ToolResult]] = {}
        self._results: dict[str, ToolResult] = {}

    def get(self, jid: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r["id"] == jid), None)

    def unseen(self) -> list[dict[str, Any]]:
        """Jobs whose result the model has not been given yet, oldest first."""
        return [r for r in self.records if not r.get("seen")]

    def start(self, call: ToolCall, step: int, index: int, key: str, untrusted: bool,
              run: Callable[[], Awaitable[ToolResult]],
              step_fn: Callable[[Callable[[], Awaitable[ToolResult]]], Awaitable[ToolResult]], *,
              hidden: dict[str, Any] | None = None, secret: str | None = None) -> ToolResult:
        """Start `run` (the tool's run through the executor) as a job, in its step; the call's answer.
        `hidden`: the label of its output when that output is to be a hidden value once delivered (the
        foreground call's rule, tether.values): it is then delivered alone, for the policy to hide.
        `secret`: the secret-bearing source it reads (`.env`, a tool declared `secret_output`): every value
        of its output is then a secret of the run once delivered (tether.policy._policy.secret_bearer)."""
        jid = job_id(step, index)
        record = self.get(jid)
        if record is None:
            record = {"id": jid, "tool": call.name, "arguments": call.arguments, "call_id": call.id, "key": key,
                      "status": RUNNING, "seen": False, "result": None, "is_error": False}
            self.records.append(record)
        if hidden is not None:
            record["hidden"] = hidden
        if secret is not None:
            record["secret"] = secret
        self.untrusted[jid] = untrusted
        work = step_fn(self._guarded(key, call, run))  # made now: a durable step takes its reserved id here
        self._tasks[jid] = task = asyncio.ensure_future(self._finish(jid, work))
        task.add_done_callback(functools.partial(self._ended, jid, work))
        if self.emit is not None:
            self.emit("started", {"job_id": jid, "name": call.name, "call_id": call.id,
                                  "arguments": call.arguments, "key": key})
        args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
        text = (f"job {jid} started: {call.name}({args}). It runs in the background; go on with other work, "
                f"check it with job_status('{jid}') or wait for it with job_wait('{jid}').")
        return ToolResult(call.id, call.name, text, full_chars=len(text),
                          job={"id": jid, "status": RUNNING, "seen": False})

    def _guarded(self, key: str, call: ToolCall,
                 run: Callable[[], Awaitable[ToolResult]]) -> Callable[[], Awaitable[ToolResult]]:
        ledger = self.ledger
        if ledger is None:
            return run

        async def once() -> ToolResult:
            # Inside the job's step: a recorded step never gets here again; one that finds its key
            # was started by a process that died before the job's result was recorded.
            if ledger.get(f"tether/job/{key}") is not None:
                text = (f"ERROR: it was running when the run's process stopped; it was not run again "
                        f"(idempotency key {key}), and whether it took effect is not known.")
                return ToolResult(call.id, call.name, text, is_error=True, full_chars=len(text), decision=CallDecision.LOST)
            ledger.put(f"tether/job/{key}", "started")
            return await run()

        return once

    async def _finish(self, jid: str, work: Awaitable[ToolResult]) -> ToolResult:
        try:
            result = await work
        except asyncio.CancelledError as exc:
            got = getattr(exc, "result", None)  # ToolCancelled carries the call's truthful answer
            result = got if isinstance(got, ToolResult) else ToolResult(
                "", "", "ERROR: the job was cancelled", is_error=True, decision=CallDecision.CANCELLED)
            result.decision = CallDecision.CANCELLED
        except Exception as exc:  # a failing step runner: the job's answer says so
            result = ToolResult("", "", f"ERROR: the job failed - {type(exc).__name__}: {exc}", is_error=True,
                                decision=CallDecision.FAILED)
        self._results[jid] = result
        record = self.get(jid)
        if record is not None:
            record.update(status=_status(result), is_error=result.is_error, result=result.content)
        if self.emit is not None:
            self.emit("ended", {"job_id": jid, "name": record["tool"] if record else "", "status": _status(result),
                                "is_error": result.is_error, "result_chars": result.full_chars or len(result.content),
                                "preview": result.content[:1000]})
        return result

    def _ended(self, jid: str, work: Awaitable[ToolResult], task: asyncio.Task[ToolResult]) -> None:
        if not task.cancelled():
            task.exception()
            return
        if asyncio.iscoroutine(work):  # cancelled before it started
            work.close()
        record = self.get(jid)
        if record is not None and record["status"] == RUNNING:
            record.update(status=CANCELLED, is_error=True, result="cancelled before it started")

    def note(self, job: dict[str, Any]) -> None:
        """What a recorded result says of a job (delivered: seen, with its result)."""
        record = self.get(str(job.get("id")))
        if record is not None:
            record.update({k: v for k, v in job.items() if k in ("status", "seen", "result", "is_error")})

    async def wait(self, jid: str | None, timeout: float | None) -> JobNote:
        """The result of job `jid` (None: the next unseen job to end) within `timeout` seconds, or a
        note that it is still running."""
        if jid is None:
            pending = self.unseen()
            if not pending:
                return self._note(None, "no job is pending: every job's result has been given already")
            ended = [r for r in pending if r["id"] not in self._tasks or self._tasks[r["id"]].done()]
            if not ended:
                tasks = [self._tasks[r["id"]] for r in pending]
                await asyncio.wait(tasks, timeout=self._bound(timeout), return_when=asyncio.FIRST_COMPLETED)
                ended = [r for r in pending if self._tasks[r["id"]].done()]
            record = ended[0] if ended else pending[0]
        else:
            record = self._record(jid)
            task = self._tasks.get(jid)
            if task is not None and not task.done():
                await asyncio.wait([task], timeout=self._bound(timeout))
        return self.status(record["id"])

    def status(self, jid: str) -> JobNote:
        record = self._record(jid)
        task = self._tasks.get(jid)
        if record.get("seen"):
            if record.get("hidden") and not record.get("is_error"):  # again behind a handle, never shown
                return self._note(record, str(record.get("result") or ""), hide=True)
            return self._note(record, f"job {jid} ({record['tool']}) {record['status']}; its result was given "
                                      f"already:\n{record.get('result') or ''}")
        if task is None:  # started by a process that is gone (a continued or recovered run's state)
            if record["status"] == RUNNING:
                text = (f"job {jid} ({record['tool']}) was running when its run stopped; it was not run again "
                        f"(idempotency key {record['key']}), and whether it took effect is not known.")
                return self._note(record, text, status=LOST, result=text, is_error=True)
            if record.get("hidden") and record["status"] == DONE and record.get("result") is not None:
                return self._note(record, str(record["result"]), status=DONE, result=str(record["result"]), hide=True)
            text = (f"job {jid} ({record['tool']}) {record['status']} before its run stopped: {record.get('result') or ''}"
                    if record.get("result") is not None else
                    f"job {jid} ({record['tool']}) was {record['status']} when its run stopped; it was not run again.")
            return self._note(record, text, status=record["status"], result=text, is_error=record["status"] != DONE)
        if not task.done():
            return self._note(record, f"job {jid} ({record['tool']}) is still running.")
        result = self._results[jid]
        status = _status(result)
        if record.get("hidden") and not result.is_error:  # its output alone: the policy puts it behind a handle
            return self._note(record, result.content, status=status, result=result.content, handle=result.handle,
                              hide=True)
        content = result.content.removeprefix("ERROR: ")
        text = f"job {jid} ({record['tool']}) {'finished' if status == DONE else status}: {content}"
        return self._note(record, text, status=status, result=result.content, is_error=result.is_error,
                          handle=result.handle)

    def _note(self, record: dict[str, Any] | None, text: str, *, status: str | None = None, result: str | None = None,
              is_error: bool = False, handle: str | None = None, hide: bool = False) -> JobNote:
        if record is None:
            return JobNote(text, False, {})
        job: dict[str, Any] = {"id": record["id"], "status": status or record["status"]}
        if status is not None:  # delivered: the model has it now
            job.update(seen=True, result=result, is_error=is_error, handle=handle)
        if hide:  # what the policy hides it by (tether.values._decide.maybe_hide): the job's call and label
            job.update(tool=record["tool"], arguments=record["arguments"], label=record["hidden"])
        return JobNote(text, self.untrusted.get(record["id"], True), job)

    def _record(self, jid: str) -> dict[str, Any]:
        record = self.get(jid)
        if record is None:
            known = ", ".join(r["id"] for r in self.records) or "none"
            raise InvalidInput(f"no job {jid!r} in this run (jobs: {known})")
        return record

    def _bound(self, timeout: float | None) -> float | None:
        left = self.seconds_left() if self.seconds_left is not None else None
        if timeout is None:
            return left
        return timeout if left is None else min(timeout, left)

    def running(self) -> list[asyncio.Task[ToolResult]]:
        return [t for t in self._tasks.values() if not t.done()]

    async def close(self, grace: float) -> None:
        """Cancel the jobs still running (a run that ends leaves no work behind) and give each
        `grace` seconds, and one more, to end (a sync tool's cancel signal is set)."""
        running = self.running()
        for task in running:
            task.cancel()
        if running:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(running, timeout=grace + 1.0)


def _status(result: ToolResult) -> str:
    if result.decision in (CANCELLED, LOST):
        return result.decision
    return FAILED if result.is_error else DONE




def _jobs_of(ctx: ToolContext) -> Jobs:
    jobs = ctx.run.jobs
    if jobs is None:
        raise InvalidInput("this run has no jobs (job tools run as jobs only inside an agent's run)")
    return jobs


def _job_status(job_id: str, ctx: ToolContext) -> JobNote:
    """Check a background job: still running, or its result.

    Args:
        job_id: the job's id, as its tool's answer gave it (e.g. "J1-0")
    """
    return _jobs_of(ctx).status(job_id)


async def _job_wait(ctx: ToolContext, job_id: str | None = None, timeout: float | None = None) -> JobNote:
    """Wait for a background job to end and get its result.

    Args:
        job_id: the job's id; leave it out to wait for the next job to end
        timeout: seconds to wait at most (default: as long as the run's time budget allows)
    """
    return await _jobs_of(ctx).wait(job_id, timeout)


def job_tools() -> list[Tool]:
    """`job_status` and `job_wait`, the tools an agent with a job tool is given."""
    return [tool(name="job_status", effect="read_only")(_job_status),
            tool(name="job_wait", effect="read_only", timeout=24 * 3600)(_job_wait)]
