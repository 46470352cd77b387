"""`Bash`: run a shell command in a working directory, in a sandbox, bounded in time and output.

The command runs as `bash -c` inside a `Sandbox` (bubblewrap by default, see tools/sandbox.py)
in its own session (process group) with stdin empty (or the call's `stdin` text) and stdout and stderr
combined. On timeout,
or if the caller is cancelled, the whole group is killed (under bubblewrap the whole PID
namespace goes with it), so children such as `sleep` in a pipeline do not outlive the call.
Output memory is bounded while reading: only the first and last halves of the cap are kept.
Where bubblewrap cannot run, commands run unconfined and every Bash call asks for approval.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tether._errors import InvalidInput, OperationFailed, TetherError
from tether.tools._base import Tool, tool
from tether.tools._sandbox import Sandbox, Unconfined, default_sandbox, sandbox_environ

if TYPE_CHECKING:
    from tether.staging import StagedWorkspace

MAX_STDIN_CHARS = 1_000_000  # what a call may give a command on its standard input
DRAIN_GRACE_SECONDS = 0.5  # after bash exits, how long background children may keep the output open


class CommandTimeout(TetherError, RuntimeError):
    """The command ran past its timeout and was killed; the message carries the partial output."""


@dataclass(slots=True)
class CommandResult:
    output: str
    exit_code: int | None
    timed_out: bool
    stragglers_killed: bool
    total_bytes: int


class _Capture:
    """Keeps the first and last `limit // 2` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 2)
        self.head_max = self.limit // 2
        self.tail_max = self.limit - self.head_max
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_max:
                del self.tail[: len(self.tail) - self.tail_max]

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return head + tail
        return f"{head}\n[... {omitted:,} bytes of output omitted ...]\n{tail}"


class _Protocol(asyncio.SubprocessProtocol):
    """Feeds output straight into the capture and signals exit and end-of-output separately.

    (asyncio's `Process.wait()` also waits for the pipes to close, so a background child that keeps
    stdout open would make it hang; here exit and EOF are two events.)
    """

    def __init__(self, capture: _Capture) -> None:
        self.capture = capture
        self.exited = asyncio.Event()
        self.eof = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.capture.feed(data.encode() if isinstance(data, str) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.eof.set()

    def process_exited(self) -> None:
        self.exited.set()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def run_command(
    command: str,
    *,
    cwd: str | Path,
    timeout: float,
    max_output_chars: int,
    env: Mapping[str, str] | None = None,
    sandbox: Sandbox | None = None,
    stdin: str | None = None,
) -> CommandResult:
    """Run `command` with `bash -c` in `cwd` inside `sandbox` (None: unconfined); kill its process
    group on timeout or cancellation. `stdin`: text the command reads on its standard input (else none)."""
    capture = _Capture(max_output_chars)
    loop = asyncio.get_running_loop()
    workdir = Path(cwd)
    launch = (sandbox or Unconfined()).launch(
        ["bash", "-c", command], cwd=workdir, env=os.environ if env is None else env)
    try:
        transport, protocol = await loop.subprocess_exec(
            lambda: _Protocol(capture),
            *launch.argv,
            cwd=os.fspath(workdir),
            # bwrap itself starts with only this environment: no process in the sandbox holds more
            env=launch.env,
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so we can kill every child at once
            pass_fds=launch.pass_fds,
        )
    except BaseException as exc:
        if launch.cleanup is not None:
            launch.cleanup()
        if isinstance(exc, FileNotFoundError):
            missing = launch.argv[0] if exc.filename is None else exc.filename
            raise OperationFailed(f"cannot start the command: {missing} not found") from None
        raise
    pid = transport.get_pid()
    if stdin is not None:  # buffered by the transport: a command that never reads it does not block us
        feed = transport.get_pipe_transport(0)
        if feed is not None:
            feed.write(stdin.encode("utf-8", errors="replace"))  # pyright: ignore[reportAttributeAccessIssue]
            feed.write_eof()  # pyright: ignore[reportAttributeAccessIssue]
    timed_out = stragglers = False
    try:
        if not await _wait(protocol.exited, timeout):
            timed_out = True
            _kill_group(pid)
            await _wait(protocol.exited, 5.0)
        if not await _wait(protocol.eof, DRAIN_GRACE_SECONDS):
            # bash is gone but background children still hold the output open: stop them.
            stragglers = not timed_out
            _kill_group(pid)
            await _wait(protocol.eof, 1.0)  # a child that escaped the group is cut off by close()
    finally:
        if transport.get_returncode() is None:
            _kill_group(pid)
        transport.close()
        if launch.cleanup is not None:
            launch.cleanup()
    return CommandResult(capture.text(), transport.get_returncode(), timed_out, stragglers, capture.total)


def format_result(result: CommandResult, timeout: float) -> str:
    """The text the model sees; raises CommandTimeout when the command timed out."""
    out = result.output
    notes: list[str] = []
    if result.stragglers_killed:
        notes.append(
            "[background processes still holding the output were stopped; "
            "redirect their output, e.g. `cmd > log 2>&1 &`, to keep them running]"
        )
    if result.timed_out:
        partial = out if out.strip() else "(none)"
        raise CommandTimeout(
            f"command timed out after {timeout:g} s and was killed (its whole process group). "
            f"Partial output:\n{partial}"
        )
    code = result.exit_code
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        notes.append(f"[killed by signal {name}]")
    elif code:
        notes.append(f"[exit code {code}]")
    if not out and not notes:
        return "(no output)"
    if notes and out and not out.endswith("\n"):
        out += "\n"
    return out + "\n".join(notes)


def shell_tool(
    cwd: str | Path,
    *,
    timeout: float = 120,
    max_output_chars: int = 30_000,
    env: Mapping[str, str] | None = None,
    sandbox: Sandbox | None = None,
    allow_net: bool = False,
    pass_env: Sequence[str] = (),
    executed_later: Sequence[str] = (),
    readable: Sequence[str] = (),
    warn: Callable[[str], None] | None = None,
    stage: StagedWorkspace | None = None,
) -> Tool:
    """The `Bash` tool: runs commands in `cwd`, confined by `sandbox`.

    `sandbox` defaults to bubblewrap around `cwd` (no network unless `allow_net`) where it works
    here; where it does not, commands run unconfined, that is said once on stderr, and every Bash
    call requires approval. `env` defaults to an allowlist of this process's environment (see
    `sandbox_environ`) plus the variables named in `pass_env`, so an injected `env` finds no
    credentials. `executed_later`: workspace paths kept read-only besides `.git`; `readable`: host
    paths commands may read besides the toolchain (see _sandbox.py). `warn` takes the "not sandboxed"
    notice instead of stderr. With a `stage` (tether.staging) commands run in the run's staged view,
    mounted at the workspace's own path inside the sandbox: what they write is staged, so a sandboxed
    call without network needs no approval (unconfined, they run in the view's directory and every
    call still asks).
    """
    if env is None:
        env = sandbox_environ(pass_env)
    workdir = Path(cwd).resolve() if stage is None else stage.workspace
    if not workdir.is_dir():
        raise InvalidInput(f"working directory {workdir} is not an existing directory")
    if timeout <= 0:
        raise InvalidInput("timeout must be positive")
    if stage is not None:
        executed_later = [*executed_later, *stage.passthrough]  # the real ones, mounted read-only
    box = sandbox if sandbox is not None else default_sandbox(
        workdir, allow_net=allow_net, executed_later=executed_later, readable=readable, warn=warn,
        view=None if stage is None else stage.view)
    # staged: its writes land in the view (confined, no network: nothing else it can change)
    staged = stage is not None and box.confined and not allow_net and getattr(box, "view", None) == stage.view
    if stage is not None and not box.confined:
        workdir = stage.view  # unconfined, it runs in the view itself (and asks before every call)

    async def Bash(command: str, stdin: str | None = None) -> str:
        """Run a shell command.

        Args:
            command: the bash command line to run, e.g. 'ls -la' or 'pytest -q tests/test_x.py'
            stdin: text the command reads on its standard input, e.g. a hidden value's handle ($v3_1) with
                command 'wc -w' (a handle is never put into the command itself)
        """
        if not command.strip():
            raise InvalidInput("command is empty")
        if stdin is not None and len(stdin) > MAX_STDIN_CHARS:
            raise InvalidInput(f"stdin is {len(stdin):,} characters; at most {MAX_STDIN_CHARS:,} (write a file "
                               "and read it instead)")
        if stage is not None:  # the staged view, made at the run's first write (this call may write)
            try:
                await asyncio.to_thread(stage.make_view)
            except (InvalidInput, OperationFailed) as exc:
                raise OperationFailed(f"{exc}; the command did not run") from None
        if not workdir.is_dir():
            raise InvalidInput(f"working directory {workdir} no longer exists")
        result = await run_command(command, cwd=workdir, timeout=timeout, max_output_chars=max_output_chars, env=env,
                                   sandbox=box, stdin=stdin)
        return format_result(result, timeout)

    confined = (" It runs sandboxed: only this directory is writable; of the rest of the machine it sees "
                "only the system's programs and libraries, read-only"
                + ("." if allow_net else ", and there is no network.")) if box.confined else ""
    return tool(
        name="Bash",
        description=(
            f"Run a bash command in {workdir} and return its combined stdout and stderr (a non-zero exit "
            f"code is reported). Standard input is empty unless stdin is given; times out after {timeout:g} s; "
            "long output keeps its start and end."
            + confined
        ),
        effect="irreversible",
        # output carries what others wrote (files, git log, file names); commands run what was written
        untrusted_output=True,
        # Slightly above our own timeout so our message (with partial output) wins over the executor's.
        timeout=timeout + 5,
        # `executes`: it runs what was written (files written from untrusted content taint the command).
        # Unconfined, nothing but a person stands between a command and the machine.
        executes=True, requires_approval=not box.confined, staged=staged,
        # the command is code: a hidden value's handle is never put into it, only into stdin (tether.values._code)
        code_args=("command",),
        # the same, as the metadata keys code read before `declared` (deprecated: removed in 0.3.0)
        metadata={"sandbox": box.description, "executes": True, "requires_approval": not box.confined,
                  "staged": staged},
    )(Bash)


__all__ = ["CommandResult", "CommandTimeout", "format_result", "run_command", "shell_tool"]
