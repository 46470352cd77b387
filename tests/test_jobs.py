"""Jobs: a slow tool declared `@tool(job=True)` runs in the background while the model goes on.

Every fake slow tool here is gated by an event the test controls: nothing races a clock."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hang import HANG

from tether import Agent, AllowAll, CancelToken, Limits, StopReason, ToolContext, tool
from tether._types import Message, ModelReply, ModelRequest, RunState, ToolCall, ToolResult
from tether.events import JobEnded, JobStarted, Notice, ToolCallEnded
from tether.models._scripted import ScriptedModel, _as_reply, call
from tether.tools import Executor, Tool
from tether.tools._jobs import Jobs

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t


class Steps(ScriptedModel):
    """A scripted model whose items may also be functions of the request (sync or async)."""

    def __init__(self, items: list) -> None:
        super().__init__(lambda request: "unused")
        self.items = list(items)

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(dataclasses.replace(request, messages=list(request.messages)))
        item = self.items.pop(0)
        if callable(item):
            item = item(request)
            if inspect.isawaitable(item):
                item = await item
        return _as_reply(item)


def agent_for(tools: list[Tool], script: list, **kw) -> Agent:
    return Agent(Steps(script), tools=tools, executor=Executor(tools, policy=AllowAll()), **kw)


def last_tool(request: ModelRequest) -> Message:
    return [m for m in request.messages if m.role == "tool"][-1]


async def test_the_models_other_calls_run_while_a_job_runs() -> None:
    release = asyncio.Event()
    seen_while_running: list[bool] = []

    @tool(job=True, effect="read_only")
    async def query_metrics(service: str) -> str:
        """Query a service's metrics (slow)."""
        await release.wait()  # ends only once the model's other call has run
        return f"{service}: p99 250 ms"

    @tool(effect="read_only")
    def read_logs(service: str) -> str:
        """Read a service's recent logs."""
        seen_while_running.append(not release.is_set())
        release.set()
        return f"{service}: 3 timeouts"

    script = [call("query_metrics", service="api"), call("read_logs", service="api"),
              call("job_wait", job_id="J1-0"), "p99 is 250 ms and the logs show 3 timeouts"]
    agent = agent_for([query_metrics, read_logs], script)
    result = await asyncio.wait_for(agent.arun("why is api slow?"), HANG)
    assert result.stop_reason is StopReason.COMPLETED, result.error
    tools = [m.content for m in result.messages if m.role == "tool"]
    assert tools[0].startswith("job J1-0 started: query_metrics(service='api')") and "job_wait('J1-0')" in tools[0]
    assert tools[1] == "api: 3 timeouts" and seen_while_running == [True]  # ran while the job was running
    assert tools[2] == "job J1-0 (query_metrics) finished: api: p99 250 ms"
    kinds = [type(e) for e in result.events]
    assert JobStarted in kinds and JobEnded in kinds
    [ended] = [e for e in result.events if isinstance(e, JobEnded)]
    assert ended.status == "done" and ended.preview == "api: p99 250 ms"
    assert result.state is not None and result.state.jobs[0]["status"] == "done" and result.state.jobs[0]["seen"]
    assert {s.name for s in agent.executor.specs} >= {"job_status", "job_wait"}  # added with a job tool only


def test_job_tools_are_only_given_to_an_agent_with_a_job_tool() -> None:
    @tool
    def plain() -> str:
        """Plain."""
        return "x"

    assert {s.name for s in Executor([plain]).specs} == {"plain"}


async def test_the_loop_waits_for_a_pending_job_instead_of_ending_or_spending_a_model_call() -> None:
    release = asyncio.Event()

    @tool(job=True, effect="read_only")
    async def query_metrics(service: str) -> str:
        """Query a service's metrics (slow)."""
        await release.wait()
        return "p99 250 ms"

    def answer(request: ModelRequest) -> ModelReply:
        return ModelReply(text=f"metrics: {last_tool(request).content}")

    def on_event(envelope) -> None:  # the job ends only once the loop is waiting for it
        if envelope.kind == "notice" and "waiting_for_jobs" in envelope.data:
            release.set()

    model = Steps([call("query_metrics", service="api"), "I'll wait for the metrics.", answer])
    agent = Agent(model, tools=[query_metrics], policy=AllowAll())
    result = await asyncio.wait_for(agent.arun("api latency?", on_event=on_event), HANG)
    assert result.stop_reason is StopReason.COMPLETED, result.error
    assert result.answer == "metrics: job J1-0 (query_metrics) finished: p99 250 ms"
    assert model.calls == 3 and result.usage.model_calls == 3  # the wait itself cost no model call
    waited = result.messages[-3]  # the model's "I'll wait", answered by the loop's job_wait
    assert waited.role == "assistant" and [c.name for c in waited.tool_calls] == ["job_wait"]
    assert any(isinstance(e, Notice) and e.notice.get("waiting_for_jobs") == ["J1-0"] for e in result.events)


async def test_the_time_budget_counts_the_wait_for_a_job() -> None:
    clock = FakeClock()
    release = asyncio.Event()

    @tool(job=True, effect="read_only")
    async def query_metrics(service: str) -> str:
        """Query a service's metrics (slow)."""
        await release.wait()
        clock.t += 100  # the job took longer than the whole time budget, while the loop waited
        return "p99 250 ms"

    def on_event(envelope) -> None:
        if envelope.kind == "notice" and "waiting_for_jobs" in envelope.data:
            release.set()

    def final(request: ModelRequest) -> ModelReply:
        return ModelReply(text=f"partial: {last_tool(request).content}")

    model = Steps([call("query_metrics", service="api"), "waiting for the metrics", final])
    agent = Agent(model, tools=[query_metrics], policy=AllowAll(), clock=clock, limits=Limits(max_seconds=10))
    result = await asyncio.wait_for(agent.arun("api latency?", on_event=on_event), HANG)
    assert result.stop_reason is StopReason.TIME_BUDGET  # no step after the wait: the budget was spent in it
    assert model.calls == 3 and result.answer == "partial: job J1-0 (query_metrics) finished: p99 250 ms"


async def test_a_wait_is_bounded_by_the_time_left_and_closing_cancels_the_job() -> None:
    cancelled = asyncio.Event()

    async def forever() -> ToolResult:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ToolResult("c1", "query_metrics", "unreachable")

    async def direct(run):
        return await run()

    jobs = Jobs([], seconds_left=lambda: 0.0)  # the run's time budget is spent
    started = jobs.start(ToolCall("c1", "query_metrics", {"service": "api"}), 1, 0, "run:1:0", False, forever, direct)
    assert started.job == {"id": "J1-0", "status": "running", "seen": False}
    note = await asyncio.wait_for(jobs.wait(None, None), HANG)  # returns at once: no time is left to wait
    assert note.text == "job J1-0 (query_metrics) is still running." and note.job == {"id": "J1-0", "status": "running"}
    await jobs.close(grace=HANG)
    assert cancelled.is_set() and jobs.records[0]["status"] == "cancelled"


async def test_cancelling_the_run_cancels_its_running_job() -> None:
    started, stopped = threading.Event(), threading.Event()

    @tool(job=True, effect="read_only")
    def scan(n: int, ctx: ToolContext) -> str:
        """A long scan that watches its cancel signal."""
        started.set()
        ctx.cancel_event.wait(HANG)
        stopped.set()
        return "stopped early"

    token = CancelToken()
    events: list = []
    agent = agent_for([scan], [call("scan", n=10), "waiting for the scan", "unused"])
    task = asyncio.create_task(agent.arun("scan", cancel=token, on_event=events.append))
    assert await asyncio.to_thread(started.wait, HANG)
    token.cancel("operator")
    result = await asyncio.wait_for(task, HANG)
    assert result.stop_reason is StopReason.CANCELLED and stopped.is_set()
    assert result.state is not None and result.state.jobs[0]["status"] == "cancelled"
    ended = [e for e in events if e.kind == "job_ended"]
    assert ended and ended[0].data["status"] == "cancelled"


async def test_a_state_with_a_job_round_trips_and_a_continued_run_never_runs_it_again() -> None:
    runs: list[str] = []
    started = asyncio.Event()

    @tool(job=True, effect="reversible")
    async def restart(service: str, ctx: ToolContext) -> str:
        """Restart a service (slow)."""
        runs.append(ctx.idempotency_key)
        started.set()
        await asyncio.Event().wait()
        return "restarted"

    async def once_started(request: ModelRequest) -> str:
        await started.wait()
        return "done?"

    first = await asyncio.wait_for(agent_for([restart], [call("restart", service="api"), once_started, "partial"],
                                             limits=Limits(max_steps=2)).arun("restart api", run_id="r1"), HANG)
    assert first.stop_reason is StopReason.MAX_STEPS and first.state is not None
    state = first.state
    state.jobs[0]["status"] = "running"  # as a process that died mid-job left it
    restored = RunState.from_json(state.to_json())
    assert restored.jobs == state.jobs and restored.jobs[0]["key"] == "r1:1:0"

    def answer(request: ModelRequest) -> ModelReply:
        return ModelReply(text=last_tool(request).content)

    again = await asyncio.wait_for(agent_for([restart], ["done?", answer]).arun("and?", state=restored, run_id="r1"), HANG)
    assert again.stop_reason is StopReason.COMPLETED
    assert "was running when its run stopped; it was not run again (idempotency key r1:1:0)" in again.answer
    assert len(runs) == 1 and again.state is not None and again.state.jobs[0]["status"] == "lost"


async def test_a_job_goes_through_the_executors_checks() -> None:
    @tool(job=True, effect="read_only")
    async def query_metrics(service: str) -> str:
        """Query."""
        return "ok"

    agent = agent_for([query_metrics], [call("query_metrics"), "gave up"])
    result = await asyncio.wait_for(agent.arun("go"), HANG)
    [ended] = [e for e in result.events if isinstance(e, ToolCallEnded)]
    assert ended.decision == "invalid_arguments" and result.state is not None and result.state.jobs == []


def test_a_durable_run_killed_while_its_job_runs_does_not_run_the_job_twice(tmp_path: Path) -> None:
    pytest.importorskip("dbos")
    db, ledger = str(tmp_path / "runs.db"), tmp_path / "ledger.txt"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(ROOT / "tests" / "job_worker.py"), db, str(ledger)], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    first = spawn()
    try:
        end = time.monotonic() + HANG
        while not (ledger.exists() and ledger.read_text()):
            assert time.monotonic() < end and first.poll() is None, "the job never started"
            time.sleep(0.05)
    finally:
        first.kill()  # SIGKILL while the job runs
        first.communicate()
    fresh = spawn()
    try:
        out, _ = fresh.communicate(timeout=HANG)
    finally:
        if fresh.poll() is None:
            fresh.kill()
    text = out.decode()
    assert fresh.returncode == 0, text
    assert ledger.read_text().splitlines() == ["ran jobs1:1:0"]  # once, never again after the restart
    assert "it was not run again (idempotency key jobs1:1:0)" in text


def test_the_on_call_example_with_a_query_metrics_job_replays() -> None:
    out = subprocess.run([sys.executable, "-m", "tether", "eval", str(ROOT / "examples/ops_assistant/jobs.toml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok  latency-metrics-job" in out.stderr and "ok  metrics-job-checked" in out.stderr


def test_the_service_streams_job_events_and_the_console_shows_them() -> None:
    pytest.importorskip("fastapi")
    from tether.server._console import _environment
    from tether.server._events import derive

    started = JobStarted(job_id="J1-0", name="query_metrics", call_id="c1", arguments={"service": "api"}, key="r:1:0")
    ended = JobEnded(job_id="J1-0", name="query_metrics", status="done", result_chars=10, preview="p99 250 ms")
    assert derive(started, None) == [("job_started", started.data)] and derive(ended, None) == [("job_ended", ended.data)]
    rows = _environment().get_template("fragments.html").make_module({})
    shown = [str(rows.event_row("r", e.kind, e.data, 1)) for e in (started, ended)]
    assert "job J1-0</b> started: query_metrics" in shown[0] and "r:1:0" in shown[0]
    assert "job J1-0</b> done: query_metrics" in shown[1] and "p99 250 ms" in shown[1]


async def test_a_jobs_untrusted_output_taints_the_run_when_the_model_is_given_it() -> None:
    from tether.policy import SafetyPolicy

    @tool(job=True, effect="read_only", untrusted_output=True)
    async def fetch_report(url: str) -> str:
        """Fetch a long report (slow)."""
        return "report body"

    agent = Agent(Steps([call("fetch_report", url="https://example.com/r"), "waiting", "the report says: report body"]),
                  tools=[fetch_report], policy=SafetyPolicy())
    result = await asyncio.wait_for(agent.arun("read the report"), HANG)
    assert result.stop_reason is StopReason.COMPLETED, result.error
    assert result.tainted  # given to the model through job_wait, checked by the policy as fetch_report's output
    assert any("report body" in m.content for m in result.messages if m.role == "tool" and m.name == "job_wait")


async def test_a_jobs_source_is_judged_by_the_policys_is_untrusted_source_hook() -> None:
    """`Policy.is_untrusted_source` (a BasePolicy hook) says whether a job's output is untrusted: a tool
    not declared untrusted is untrusted when the policy says its source is."""
    from tether import BasePolicy

    @tool(job=True, effect="read_only")
    async def fetch_feed(url: str) -> str:
        """Fetch a feed (slow)."""
        return "feed body"

    class Judging(BasePolicy):
        def __init__(self, untrusted: frozenset[str]) -> None:
            self.untrusted = untrusted
            self.seen: dict[str, bool | None] = {}

        def is_untrusted_source(self, tool: Tool, state: object = None) -> bool:
            return tool.name in self.untrusted

        def after_call(self, tool: Tool, result: ToolResult, ctx: object) -> ToolResult:
            self.seen[tool.name] = result.untrusted
            return result

    @tool(effect="read_only", untrusted_output=True)
    def read_mail(n: int) -> str:
        """Read a mail."""
        return "mail"

    # the default: the tool's own declaration
    assert (BasePolicy().is_untrusted_source(fetch_feed), BasePolicy().is_untrusted_source(read_mail)) == (False, True)
    for untrusted, expected in ((frozenset({"fetch_feed"}), True), (frozenset(), None)):
        policy = Judging(untrusted)
        agent = Agent(Steps([call("fetch_feed", url="https://example.com/f"), "waiting", "the feed says: feed body"]),
                      tools=[fetch_feed], policy=policy)
        result = await asyncio.wait_for(agent.arun("read the feed"), HANG)
        assert result.stop_reason is StopReason.COMPLETED, result.error
        assert policy.seen.get("job_wait") is expected, (untrusted, policy.seen)
