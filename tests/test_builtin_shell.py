"""The Bash tool: real bash subprocesses, timeouts that kill the process group, capped output."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tether.tools.base import Tool
from tether.tools.builtin import coding_tools, shell_tool
from tether.tools.builtin.shell import CommandTimeout
from tether.types import Effect


async def run(tool: Tool, command: str) -> str:
    return await tool.fn(**tool.validator.validate({"command": command}))


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie awaiting an absent reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def wait_dead(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def test_metadata(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=7)
    assert bash.name == "Bash"
    assert bash.effect is Effect.IRREVERSIBLE
    assert bash.is_async
    assert bash.timeout is not None and bash.timeout > 7
    assert list(bash.parameters["properties"]) == ["command"]
    names = [t.name for t in coding_tools(tmp_path)]
    assert names == ["Read", "Write", "Edit", "Glob", "Grep", "Bash"]


def test_bad_working_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an existing directory"):
        shell_tool(tmp_path / "missing")


async def test_output_combined_and_exit_codes(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path)
    assert await run(bash, "echo out; echo err >&2") == "out\nerr\n"
    assert await run(bash, "printf 'no newline'; exit 3") == "no newline\n[exit code 3]"
    assert await run(bash, "exit 1") == "[exit code 1]"
    assert await run(bash, "true") == "(no output)"
    assert await run(bash, "kill -9 $$") == "[killed by signal SIGKILL]"
    with pytest.raises(ValueError, match="empty"):
        await run(bash, "   ")


async def test_runs_in_cwd_with_stdin_closed(tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hi there\n")
    bash = shell_tool(tmp_path)
    assert await run(bash, "pwd") == f"{tmp_path.resolve()}\n"
    assert await run(bash, "cat hello.txt") == "hi there\n"
    # `cat` with no file reads stdin: it must see EOF at once instead of waiting for input.
    assert await run(bash, "cat; echo after") == "after\n"


async def test_env_override(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ONLY": "this"})
    assert await run(bash, "echo $ONLY ${HOME:-nohome}") == "this nohome\n"


async def test_timeout_kills_process_group_and_keeps_partial_output(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        await run(bash, "echo started; sleep 30 & echo $! > child.pid; wait")
    assert time.monotonic() - started < 10  # returned, not after the 30 s sleep
    message = str(info.value)
    assert "timed out after 0.5 s" in message
    assert "started" in message
    child = int((tmp_path / "child.pid").read_text())
    assert await wait_dead(child), "the background sleep survived the timeout"


async def test_foreground_sleep_times_out(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=0.5)
    with pytest.raises(CommandTimeout, match=r"timed out after 0.5 s.*\n\(none\)"):
        await run(bash, "sleep 30")


async def test_background_children_holding_output_are_stopped(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=20)
    started = time.monotonic()
    out = await run(bash, "sleep 30 & echo $! > bg.pid; echo done")
    assert time.monotonic() - started < 10
    assert out.startswith("done\n[background processes still holding the output were stopped")
    assert await wait_dead(int((tmp_path / "bg.pid").read_text()))


async def test_background_children_with_redirected_output_keep_running(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=20)
    out = await run(bash, "sleep 30 > /dev/null 2>&1 & echo $! > bg.pid; echo ok")
    assert out == "ok\n"
    pid = int((tmp_path / "bg.pid").read_text())
    try:
        assert alive(pid)
    finally:
        os.kill(pid, 9)


async def test_output_cap_keeps_head_and_tail(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, max_output_chars=1_000)
    out = await run(bash, "seq 1 100000")
    assert out.startswith("1\n2\n3\n")
    assert out.endswith("99999\n100000\n")
    assert "bytes of output omitted" in out
    assert len(out) < 1_100
    total = len("\n".join(str(i) for i in range(1, 100_001))) + 1
    assert f"[... {total - 1_000:,} bytes of output omitted ...]" in out


async def test_huge_output_is_bounded(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, max_output_chars=200)
    out = await run(bash, "head -c 20000000 /dev/zero | tr '\\0' a")
    assert "[... 19,999,800 bytes of output omitted ...]" in out
    assert len(out) < 300


async def test_cancellation_kills_the_group(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=60)
    task = asyncio.create_task(run(bash, "sleep 30 & echo $! > c.pid; wait"))
    pid_file = tmp_path / "c.pid"
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(int(pid_file.read_text()))


async def test_parallel_calls_overlap(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path)
    started = time.monotonic()
    outs = await asyncio.gather(*(run(bash, f"sleep 1; echo {i}") for i in range(4)))
    elapsed = time.monotonic() - started
    assert outs == [f"{i}\n" for i in range(4)]
    assert elapsed < 3.5  # run one after another they would need at least 4 s


async def test_bash_does_not_hand_secrets_to_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-secret-value")
    monkeypatch.setenv("TETHER_PLAIN_SETTING", "visible")
    bash = shell_tool(tmp_path, timeout=10)
    out = await bash.fn(command="echo key=${OPENROUTER_API_KEY:-none} plain=$TETHER_PLAIN_SETTING")
    assert "key=none" in out and "plain=visible" in out
    assert "sk-secret-value" not in out
