"""A cancelled run cancels its tools: a sync tool gets the signal through its `ToolContext`, Bash and
`run_process` lose their processes, and each call's answer says truthfully what happened after the cancel.

Ordering is by events (threading.Event, FIFOs, the context's own cancel signal), never by sleeping; the
waits on a clock here only catch hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

import pytest
from conftest import need_bubblewrap
from hang import HANG
from test_builtin_shell import for_the_sandbox_user, none_left

from tether import Agent, AllowAll, CancelToken, RunResult, StopReason, ToolContext, tool
from tether._errors import OperationFailed
from tether._types import Message
from tether.events import TraceEvent
from tether.models._scripted import ScriptedModel, call
from tether.tools import Executor, Tool, run_process
from tether.tools._sandbox import Bubblewrap, Sandbox, Unconfined
from tether.tools.builtin import shell_tool


def agent_for(tools: list[Tool], replies: list, **executor: float) -> Agent:
    return Agent(ScriptedModel(replies), tools=tools,
                 executor=Executor(tools, policy=AllowAll(), **executor))  # type: ignore[arg-type]


def tool_messages(result: RunResult) -> list[Message]:
    return [m for m in result.messages if m.role == "tool"]


def unique() -> str:
    """A `sleep` duration no other process on the machine has on its command line."""
    return f"30.{os.getpid()}{threading.get_ident() % 100_000}"


async def test_a_sync_tool_that_watches_its_context_stops_and_its_answer_is_reported() -> None:
    started, stopped = threading.Event(), threading.Event()

    @tool
    def scan(n: int, ctx: ToolContext) -> str:
        """Works until told to stop."""
        started.set()
        done = 0
        while not ctx.cancel_event.wait(HANG):  # one piece of work per wait; here: none until the cancel
            done += 1
        stopped.set()
        return f"stopped after {done} of {n} files"

    token = CancelToken()
    task = asyncio.create_task(agent_for([scan], [call("scan", n=10), "unused"]).arun("go", cancel=token))
    await asyncio.to_thread(started.wait, HANG)
    token.cancel("user pressed stop")
    result = await asyncio.wait_for(task, HANG)
    assert stopped.is_set()
    assert result.stop_reason is StopReason.CANCELLED and result.error == "user pressed stop"
    [answer] = tool_messages(result)
    assert answer.content == "'scan' finished after it was cancelled: stopped after 0 of 10 files"
    ended = [e.data for e in result.trace if e.kind == "tool_call"]
    assert [(e["preview"], e["is_error"]) for e in ended] == [(answer.content, False)]  # the trace says the same


async def test_a_sync_tool_that_ignores_the_cancel_and_finishes_is_reported_as_finished() -> None:
    started, release = threading.Event(), threading.Event()
    seen: list[ToolContext] = []
    written: list[str] = []

    @tool(effect="reversible")
    def write_note(text: str, ctx: ToolContext) -> str:
        """Writes a note (and pays no attention to cancellation)."""
        seen.append(ctx)
        started.set()
        release.wait(HANG)
        written.append(text)
        return "written"

    token = CancelToken()
    agent = agent_for([write_note], [call("write_note", text="hi"), "unused"], cancel_grace=HANG)
    task = asyncio.create_task(agent.arun("go", cancel=token))
    await asyncio.to_thread(started.wait, HANG)
    token.cancel()
    await asyncio.to_thread(seen[0].cancel_event.wait, HANG)  # the cancel reached the call...
    release.set()  # ...and only then does its effect happen
    result = await asyncio.wait_for(task, HANG)
    assert result.stop_reason is StopReason.CANCELLED and written == ["hi"]
    [answer] = tool_messages(result)
    assert answer.content == "'write_note' finished after it was cancelled: written"
    assert result.findings == [f'write_note({{"text": "hi"}}) -> {answer.content}']


async def test_a_sync_tool_still_running_after_the_grace_is_reported_as_left_running() -> None:
    started, release = threading.Event(), threading.Event()

    @tool
    def stuck(x: int) -> str:
        """Blocks until the test lets it go."""
        started.set()
        release.wait(HANG)
        return "late"

    token = CancelToken()
    task = asyncio.create_task(agent_for([stuck], [call("stuck", x=1)], cancel_grace=0.05).arun("go", cancel=token))
    await asyncio.to_thread(started.wait, HANG)
    token.cancel()
    try:
        result = await asyncio.wait_for(task, HANG)
    finally:
        release.set()  # only after the run ended: it cannot have finished within the grace
    [answer] = tool_messages(result)
    assert "'stuck' was cancelled while it ran and did not stop within 0.05 s" in answer.content
    assert "left running and may still take effect" in answer.content and "not run" not in answer.content


async def test_calls_that_never_started_say_not_run_and_the_started_one_says_what_it_did() -> None:
    started = threading.Event()
    ran: list[int] = []

    @tool
    def job(i: int, ctx: ToolContext) -> str:
        """One job; stops when cancelled."""
        ran.append(i)
        started.set()
        ctx.cancel_event.wait(HANG)
        return f"job {i} stopped"

    token = CancelToken()
    agent = agent_for([job], [[call("job", i=1), call("job", i=2)], "unused"], max_workers=1)
    task = asyncio.create_task(agent.arun("go", cancel=token))
    await asyncio.to_thread(started.wait, HANG)
    token.cancel()
    result = await asyncio.wait_for(task, HANG)
    assert ran == [1]  # the second waited for the only worker thread
    first, second = tool_messages(result)
    assert first.content == "'job' finished after it was cancelled: job 1 stopped"
    assert second.content == "ERROR: 'job' was not run: it was cancelled before it started"


async def test_cancelling_the_run_task_signals_its_sync_tools_too() -> None:
    started = threading.Event()

    @tool
    def wait_for_stop(x: int, ctx: ToolContext) -> str:
        """Waits for the cancel signal."""
        started.set()
        return "saw the cancel" if ctx.cancel_event.wait(HANG) else "timed out"

    task = asyncio.create_task(agent_for([wait_for_stop], [call("wait_for_stop", x=1)]).arun("go"))
    await asyncio.to_thread(started.wait, HANG)
    task.cancel()
    result = await asyncio.wait_for(task, HANG)
    assert result.stop_reason is StopReason.CANCELLED
    [answer] = tool_messages(result)
    assert answer.content == "'wait_for_stop' finished after it was cancelled: saw the cancel"


def test_cancel_from_another_thread_while_a_synchronous_run_waits_on_a_sync_tool() -> None:
    started = threading.Event()

    @tool
    def crawl(url: str, ctx: ToolContext) -> str:
        """Crawls until cancelled."""
        started.set()
        ctx.cancel_event.wait(HANG)
        return f"stopped crawling {url}" if ctx.cancelled else "never cancelled"

    token = CancelToken()
    agent = agent_for([crawl], [call("crawl", url="a.example"), "unused"])
    threading.Thread(target=lambda: (started.wait(HANG), token.cancel("stopped from a thread")), daemon=True).start()
    done: list[RunResult] = []
    runner = threading.Thread(target=lambda: done.append(agent.run("go", cancel=token)), daemon=True)
    runner.start()
    runner.join(HANG)
    assert done, "the run did not end after the cancel"
    assert done[0].stop_reason is StopReason.CANCELLED and done[0].error == "stopped from a thread"
    [answer] = tool_messages(done[0])
    assert answer.content == "'crawl' finished after it was cancelled: stopped crawling a.example"


def fifo_in(workspace: Path) -> Path:
    """A FIFO the command writes to once it runs: the test's read returns exactly then."""
    fifo = workspace / "started.fifo"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    if os.geteuid() == 0:
        os.chown(fifo, 65534, 65534)
    return fifo


async def cancel_bash_mid_command(workspace: Path, box: Sandbox) -> None:
    fifo = fifo_in(workspace)
    duration = unique()
    bash = shell_tool(workspace, timeout=HANG, sandbox=box)
    command = f"echo started > {fifo.name}; sleep {duration}; touch effect.txt"
    token = CancelToken()
    events: list[TraceEvent] = []
    task = asyncio.create_task(agent_for([bash], [call("Bash", command=command)]).arun(
        "go", cancel=token, on_event=events.append))
    assert (await asyncio.to_thread(fifo.read_text)).strip() == "started"  # bash runs; `sleep` is next
    token.cancel()
    result = await asyncio.wait_for(task, HANG)
    assert result.stop_reason is StopReason.CANCELLED
    assert await none_left(duration, within=HANG), "a process of the command outlived the cancelled run"
    assert not (workspace / "effect.txt").exists()  # and with bash gone, nothing can create it any more
    [answer] = tool_messages(result)
    assert answer.content == "ERROR: 'Bash' was cancelled while it ran and was stopped before it finished"
    assert [e.kind for e in events][-3:] == ["tool_call", "notice", "stop"]  # the call's end is in the trace


async def test_a_cancelled_run_kills_its_bash_command(tmp_path: Path) -> None:
    await cancel_bash_mid_command(tmp_path, Unconfined())


async def test_a_cancelled_run_kills_its_bash_command_in_the_sandbox(tmp_path: Path) -> None:
    need_bubblewrap()
    await cancel_bash_mid_command(for_the_sandbox_user(tmp_path), Bubblewrap(for_the_sandbox_user(tmp_path)))


async def test_run_process_is_killed_when_the_call_is_cancelled(tmp_path: Path) -> None:
    fifo = fifo_in(tmp_path)
    duration = unique()

    @tool(effect="reversible")
    def build(target: str, ctx: ToolContext) -> str:
        """Builds a target with a long command."""
        out = run_process(["bash", "-c", f"echo started > {fifo}; sleep {duration}; touch {tmp_path}/effect.txt"],
                          ctx, cwd=tmp_path)
        return out.stdout

    token = CancelToken()
    task = asyncio.create_task(agent_for([build], [call("build", target="all")]).arun("go", cancel=token))
    assert (await asyncio.to_thread(fifo.read_text)).strip() == "started"
    token.cancel()
    result = await asyncio.wait_for(task, HANG)
    assert await none_left(duration, within=HANG)
    assert not (tmp_path / "effect.txt").exists()
    [answer] = tool_messages(result)
    assert answer.content.startswith("ERROR: 'build' was cancelled while it ran, then ended with an error: ")
    assert "bash was killed: the call was cancelled" in answer.content


def test_run_process_returns_the_output_and_kills_what_the_command_left_behind(tmp_path: Path) -> None:
    duration = unique()
    out = run_process(["bash", "-c", f"sleep {duration} > /dev/null 2>&1 & echo hi; echo oops >&2; exit 3"],
                      ToolContext(run_id="r", call_id="c"), cwd=tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (3, "hi\n", "oops\n")
    assert asyncio.run(none_left(duration, within=HANG))


def test_run_process_timeout_and_a_missing_program_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(OperationFailed, match=r"timed out after 0\.2 s and was killed"):
        run_process(["sleep", unique()], timeout=0.2)
    with pytest.raises(OperationFailed, match="cannot start no-such-program-here"):
        run_process(["no-such-program-here"])
    ctx = ToolContext(run_id="r", call_id="c")
    ctx.cancel_event.set()
    with pytest.raises(OperationFailed, match="not started: the call was cancelled"):
        run_process(["true"], ctx)


async def test_an_async_tool_that_ignores_its_cancellation_is_abandoned_and_said_to_be_unknown() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    @tool
    async def stubborn(x: int) -> str:
        """Swallows its cancellation and waits for the test."""
        entered.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        return "late"

    token = CancelToken()
    task = asyncio.create_task(agent_for([stubborn], [call("stubborn", x=1)], cancel_grace=0.01).arun(
        "go", cancel=token))
    await entered.wait()
    token.cancel()
    try:
        result = await asyncio.wait_for(task, HANG)  # not held up by the tool: it is abandoned
    finally:
        release.set()
    assert result.stop_reason is StopReason.CANCELLED
    [answer] = tool_messages(result)
    assert answer.content == ("ERROR: not finished: the run was cancelled while it ran (whether it took effect "
                              "is not known)")
