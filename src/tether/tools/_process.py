"""`run_process`: a subprocess for a sync tool that nothing outlives: its whole process group is
killed when the call is cancelled (`ToolContext.cancel_event`), when it times out, and when it ends.

(Async tools are cancelled the asyncio way: `tether.tools.builtin._shell.run_command` kills its
process group then; the Bash tool uses it.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tether._errors import OperationFailed
from tether.tools._context import ToolContext


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_process(
    argv: Sequence[str],
    ctx: ToolContext | None = None,
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in its own process group and return its exit code, stdout and stderr (text; both
    held in memory). Its group is killed, and `OperationFailed` raised, when `ctx`'s call is
    cancelled or `timeout` seconds pass; whatever the command left running in its group is killed
    when it exits. A non-zero exit code is returned, not raised."""
    if ctx is not None and ctx.cancelled:
        raise OperationFailed(f"{argv[0]} was not started: the call was cancelled")
    try:
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8", errors="replace",
            start_new_session=True,  # its own process group: one signal reaches everything it starts
        )
    except FileNotFoundError as exc:
        raise OperationFailed(f"cannot start {argv[0]}: {exc.filename or argv[0]} not found") from None
    remove = ctx.cancel_event.on_cancel(lambda: _kill_group(proc.pid)) if ctx is not None else None
    try:
        try:
            stdout, stderr = proc.communicate(input, timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            raise OperationFailed(f"{argv[0]} timed out after {timeout:g} s and was killed") from None
    finally:
        if remove is not None:
            remove()
        _kill_group(proc.pid)  # what it left running in its group (the leader is reaped, the group id stays)
        if proc.poll() is None:
            proc.wait()
    if ctx is not None and ctx.cancelled:
        raise OperationFailed(f"{argv[0]} was killed: the call was cancelled (exit code {proc.returncode})")
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)


__all__ = ["run_process"]
