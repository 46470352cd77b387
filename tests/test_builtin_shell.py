"""The Bash tool: real bash subprocesses, in a real bubblewrap sandbox and unconfined; timeouts that
kill every process of the command, capped output, and the sandbox's guarantees checked from inside.

The guarantee tests need bubblewrap able to create namespaces here; where it cannot, they are
skipped with the reason, and `test_fallback_*` prove the fallback (approval for every call) instead.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hang import HANG

from tether._types import Effect
from tether.tools._base import Tool
from tether.tools._sandbox import Bubblewrap, Sandbox, Unconfined, default_sandbox, probe_bubblewrap
from tether.tools.builtin import coding_tools, shell_tool
from tether.tools.builtin._shell import CommandTimeout

BWRAP_PROBLEM = probe_bubblewrap()
needs_bwrap = pytest.mark.skipif(
    BWRAP_PROBLEM is not None,
    reason=f"bubblewrap cannot run here ({BWRAP_PROBLEM}); test_fallback_* prove the fallback instead",
)


async def run(tool: Tool, command: str) -> str:
    return await tool.fn(**tool.validator.validate({"command": command}))


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie awaiting an absent reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def wait_dead(pid: int, within: float = HANG) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def processes_with(marker: str) -> list[int]:
    """Host pids of live processes whose command line contains `marker` (works across PID namespaces)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


async def none_left(marker: str, within: float = HANG) -> bool:  # only a hang: a busy machine reaps slowly
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not processes_with(marker):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.fixture(params=["unconfined", "bubblewrap"])
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Sandbox:
    """Behaviour every sandbox shares runs under both."""
    if request.param == "unconfined":
        return Unconfined()
    if BWRAP_PROBLEM is not None:
        pytest.skip(f"bubblewrap cannot run here ({BWRAP_PROBLEM})")
    return Bubblewrap(for_the_sandbox_user(tmp_path))


def for_the_sandbox_user(path: Path) -> Path:
    """`path`, owned by the user sandboxed commands run as when the tests run as root (nobody: they
    never run as root), so they can write it as they would a normal user's workspace."""
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    return path


# ----- what every sandbox does ----------------------------------------------------------------------


def test_metadata(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=7)
    assert bash.name == "Bash"
    assert bash.effect is Effect.IRREVERSIBLE
    assert bash.is_async
    assert bash.timeout is not None and bash.timeout > 7
    assert list(bash.parameters["properties"]) == ["command", "stdin"] and bash.parameters["required"] == ["command"]
    names = [t.name for t in coding_tools(tmp_path)]
    assert names == ["Read", "Write", "Edit", "Glob", "Grep", "Bash"]
    confined = BWRAP_PROBLEM is None
    assert bash.metadata["requires_approval"] is (not confined)
    assert ("sandboxed" in bash.description) is confined


def test_bad_working_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an existing directory"):
        shell_tool(tmp_path / "missing")


async def test_output_combined_and_exit_codes(tmp_path: Path, box: Sandbox) -> None:
    bash = shell_tool(tmp_path, sandbox=box)
    assert await run(bash, "echo out; echo err >&2") == "out\nerr\n"
    assert await run(bash, "printf 'no newline'; exit 3") == "no newline\n[exit code 3]"
    assert await run(bash, "exit 1") == "[exit code 1]"
    assert await run(bash, "true") == "(no output)"
    # unconfined we see the signal; bwrap reports it the shell's way, 128 + 9
    assert await run(bash, "kill -9 $$") in ("[killed by signal SIGKILL]", "[exit code 137]")
    with pytest.raises(ValueError, match="empty"):
        await run(bash, "   ")


async def test_runs_in_cwd_with_stdin_closed(tmp_path: Path, box: Sandbox) -> None:
    (tmp_path / "hello.txt").write_text("hi there\n")
    bash = shell_tool(tmp_path, sandbox=box)
    assert await run(bash, "pwd") == f"{tmp_path.resolve()}\n"
    assert await run(bash, "cat hello.txt") == "hi there\n"
    # `cat` with no file reads stdin: it must see EOF at once instead of waiting for input.
    assert await run(bash, "cat; echo after") == "after\n"
    assert await run(bash, "echo made > new.txt && cat new.txt") == "made\n"
    assert (tmp_path / "new.txt").read_text() == "made\n"  # the workspace is writable, for real


async def test_env_override(tmp_path: Path, box: Sandbox) -> None:
    bash = shell_tool(tmp_path, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ONLY": "this"}, sandbox=box)
    only, home = (await run(bash, "echo $ONLY ${HOME:-nohome}")).split()
    assert only == "this"
    assert home != os.environ.get("HOME") and home != "nohome"  # a private HOME, not the user's


async def test_foreground_sleep_times_out(tmp_path: Path, box: Sandbox) -> None:
    bash = shell_tool(tmp_path, timeout=0.5, sandbox=box)
    with pytest.raises(CommandTimeout, match=r"timed out after 0.5 s.*\n\(none\)"):
        await run(bash, "sleep 30")


async def test_output_cap_keeps_head_and_tail(tmp_path: Path, box: Sandbox) -> None:
    bash = shell_tool(tmp_path, max_output_chars=1_000, sandbox=box)
    out = await run(bash, "seq 1 100000")
    assert out.startswith("1\n2\n3\n")
    assert out.endswith("99999\n100000\n")
    assert "bytes of output omitted" in out
    assert len(out) < 1_100
    total = len("\n".join(str(i) for i in range(1, 100_001))) + 1
    assert f"[... {total - 1_000:,} bytes of output omitted ...]" in out


async def test_huge_output_is_bounded(tmp_path: Path, box: Sandbox) -> None:
    bash = shell_tool(tmp_path, max_output_chars=200, sandbox=box)
    out = await run(bash, "head -c 20000000 /dev/zero | tr '\\0' a")
    assert "[... 19,999,800 bytes of output omitted ...]" in out
    assert len(out) < 300


async def test_parallel_calls_overlap(tmp_path: Path, box: Sandbox) -> None:
    """Each command waits until all four have started (a barrier of marker files): run one after
    another, the first would wait for the others forever (here: until its 60 s guard says so)."""
    bash = shell_tool(tmp_path, sandbox=box)
    barrier = ("touch started.{i}; n=0; while [ $(ls started.* | wc -l) -lt 4 ]; do n=$((n+1)); "
               "[ $n -gt 1200 ] && echo alone && exit 1; sleep 0.05; done; echo {i}")
    outs = await asyncio.gather(*(run(bash, barrier.format(i=i)) for i in range(4)))
    assert [o.strip() for o in outs] == [str(i) for i in range(4)]


async def test_bash_does_not_hand_secrets_to_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     box: Sandbox) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-secret-value")
    monkeypatch.setenv("TETHER_DB", "postgres://app:hunter2@db/x")
    monkeypatch.setenv("TETHER_PLAIN_SETTING", "visible")
    probe = "echo key=${OPENROUTER_API_KEY:-none} db=${TETHER_DB:-none} plain=${TETHER_PLAIN_SETTING:-none}"
    bash = shell_tool(tmp_path, timeout=HANG, sandbox=box)
    assert await bash.fn(command=probe) == "key=none db=none plain=none\n"  # an allowlist: named or absent
    bash = shell_tool(tmp_path, timeout=HANG, sandbox=box, pass_env=["TETHER_PLAIN_SETTING"])
    assert await bash.fn(command=probe) == "key=none db=none plain=visible\n"


async def test_timeout_kills_every_process_of_the_command(tmp_path: Path, box: Sandbox) -> None:
    bash = shell_tool(tmp_path, timeout=1, sandbox=box)
    marker = f"30{os.getpid() % 1000}.{time.time_ns() % 10**6}"  # a unique `sleep` duration to find them by
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        await run(bash, f"echo started; sleep {marker} & sleep {marker} | cat & wait")
    assert time.monotonic() - started < HANG  # returned, not after the long sleep (hours: the marker)
    assert "timed out after 1 s" in str(info.value) and "started" in str(info.value)
    assert await none_left(marker), "a child of the command survived the timeout"


async def test_cancellation_kills_every_process_of_the_command(tmp_path: Path, box: Sandbox) -> None:
    bash = shell_tool(tmp_path, timeout=HANG, sandbox=box)
    marker = f"31{os.getpid() % 1000}.{time.time_ns() % 10**6}"
    task = asyncio.create_task(run(bash, f"sleep {marker} & echo started > c.txt; wait"))
    for _ in range(int(HANG / 0.05)):
        if (tmp_path / "c.txt").exists() and processes_with(marker):
            break
        await asyncio.sleep(0.05)
    assert processes_with(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await none_left(marker)


# ----- unconfined: process-group semantics (host pids) ----------------------------------------------


async def test_unconfined_background_children_holding_output_are_stopped(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=HANG, sandbox=Unconfined())
    started = time.monotonic()
    out = await run(bash, f"sleep {2 * HANG:g} & echo $! > bg.pid; echo done")
    assert time.monotonic() - started < HANG  # returned, not after the child's sleep
    assert out.startswith("done\n[background processes still holding the output were stopped")
    assert await wait_dead(int((tmp_path / "bg.pid").read_text()))


async def test_unconfined_background_children_with_redirected_output_keep_running(tmp_path: Path) -> None:
    bash = shell_tool(tmp_path, timeout=HANG, sandbox=Unconfined())
    out = await run(bash, "sleep 30 > /dev/null 2>&1 & echo $! > bg.pid; echo ok")
    assert out == "ok\n"
    pid = int((tmp_path / "bg.pid").read_text())
    try:
        assert alive(pid)
    finally:
        os.kill(pid, 9)


# ----- the sandbox's guarantees, checked from inside ------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return for_the_sandbox_user(ws)


@needs_bwrap
async def test_a_secret_outside_the_workspace_cannot_be_read(workspace: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "secret.txt").write_text("TOP-SECRET-OUTSIDE\n")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE-KEY-IN-HOME\n")
    monkeypatch.setenv("HOME", str(home))
    bash = shell_tool(workspace, timeout=HANG, sandbox=Bubblewrap(workspace))
    out = await run(bash, f"cat {tmp_path}/secret.txt {home}/.ssh/id_rsa ~/.ssh/id_rsa; ls -a {tmp_path}")
    assert "TOP-SECRET" not in out and "PRIVATE-KEY" not in out
    assert "No such file or directory" in out
    # an explicitly hidden file or directory is gone too
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "k").write_text("HIDDEN-DIR-SECRET")
    hidden = Bubblewrap(workspace, hidden=[tmp_path / "keys"])
    assert "HIDDEN-DIR-SECRET" not in await run(shell_tool(workspace, sandbox=hidden), f"cat {tmp_path}/keys/k")


@needs_bwrap
async def test_the_parents_environment_is_not_visible_through_proc(workspace: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_PROBE_API_KEY", "sk-parent-secret-4242")
    bash = shell_tool(workspace, timeout=HANG)  # the default sandbox, as the CLI builds it
    out = await run(bash, "echo ppid=$PPID; cat /proc/$PPID/environ /proc/1/environ | tr '\\0' '\\n'; ls /proc")
    assert "sk-parent-secret-4242" not in out
    assert "ppid=1" in out  # its own PID namespace: the parent is the sandbox's init
    pids = [w for w in out.split() if w.isdigit()]
    assert len(pids) < 10, f"/proc shows more than the sandbox's own processes: {pids}"


@pytest.fixture
def host_server() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 that answers 'reached'."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"reached\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        server.close()


@needs_bwrap
async def test_no_network_unless_allowed(workspace: Path, host_server: int) -> None:
    probe = (f"python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', {host_server}), 3); "
             f"print(s.recv(20).decode().strip())\" 2>&1 | tail -1; tail -n +3 /proc/net/dev | cut -d: -f1")
    out = await run(shell_tool(workspace, timeout=HANG, sandbox=Bubblewrap(workspace)), probe)
    assert "reached" not in out and "Connection refused" in out
    assert out.split()[-1] == "lo"  # loopback only
    allowed = await run(shell_tool(workspace, timeout=HANG, sandbox=Bubblewrap(workspace, allow_net=True)), probe)
    assert "reached" in allowed


@needs_bwrap
async def test_writes_outside_the_workspace_fail(workspace: Path, tmp_path: Path) -> None:
    here = Path(__file__).resolve().parent  # a directory that is neither hidden nor the workspace
    marker = f"tether-sandbox-probe-{os.getpid()}"
    git = workspace / ".git" / "hooks"
    git.mkdir(parents=True)
    bash = shell_tool(workspace, timeout=HANG, sandbox=Bubblewrap(workspace))
    out = await run(bash, f"touch {here}/{marker}; touch /etc/{marker}; echo x > {tmp_path}/{marker}; "
                          f"echo evil > .git/hooks/pre-commit; echo ok > inside.txt; cat inside.txt")
    # each of the three writes fails: read-only, or not there at all (a checkout under /tmp sits under the
    # sandbox's private /tmp, where the tests directory does not exist)
    assert out.count("Read-only file system") + out.count("No such file or directory") >= 3
    assert out.rstrip().endswith("ok")
    assert not (here / marker).exists() and not Path(f"/etc/{marker}").exists()
    assert not (tmp_path / marker).exists()  # /tmp in the sandbox is private
    assert not (git / "pre-commit").exists()  # a git hook would run later, outside the sandbox
    assert (workspace / "inside.txt").read_text() == "ok\n"


@needs_bwrap
async def test_a_fork_bomb_is_killed_at_the_timeout(workspace: Path) -> None:
    bash = shell_tool(workspace, timeout=1.5, sandbox=Bubblewrap(workspace))
    marker = f"32{os.getpid() % 1000}.{time.time_ns() % 10**6}"
    # A bounded bomb (2^7 processes, so the shared machine survives), each escaping its process group
    # with setsid, as a real bomb would: only the PID namespace takes them all down.
    bomb = f"b() {{ [ $1 -lt 6 ] && {{ setsid bash -c \"$(declare -f b); b $(( $1 + 1 ))\" & b $(( $1 + 1 )) & }}; sleep {marker}; }}; b 0"
    with pytest.raises(CommandTimeout):
        await run(bash, bomb)
    assert await none_left(marker), f"{len(processes_with(marker))} processes of the bomb survived"


# ----- where bubblewrap cannot run ------------------------------------------------------------------


def test_fallback_when_bubblewrap_cannot_create_namespaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`/bin/false` stands in for a bwrap that fails at start (no user namespaces): the tool runs
    unconfined, says so once on stderr, and asks approval for every call."""
    assert probe_bubblewrap("/bin/false") is not None
    first = default_sandbox(tmp_path, bwrap="/bin/false")
    second = default_sandbox(tmp_path, bwrap="/bin/false")
    assert not first.confined and not second.confined
    err = capsys.readouterr().err
    assert err.count("Bash is not sandboxed") == 1 and "every Bash call needs approval" in err
    bash = shell_tool(tmp_path, sandbox=first)
    assert bash.metadata["requires_approval"] is True
    assert "sandboxed" not in bash.description


def test_fallback_when_bubblewrap_is_missing(tmp_path: Path) -> None:
    said: list[str] = []
    box = default_sandbox(tmp_path, bwrap=str(tmp_path / "no-bwrap-here"), warn=said.append)
    assert not box.confined
    assert len(said) == 1 and "cannot start" in said[0]


async def test_fallback_calls_need_approval_and_are_refused_without_it(tmp_path: Path) -> None:
    """Through the real policy: with nobody to approve, an unconfined Bash call does not run."""
    from tether import Agent
    from tether.models._scripted import ScriptedModel, call
    from tether.policy import DenyAll, SafetyPolicy

    bash = shell_tool(tmp_path, sandbox=Unconfined())
    model = ScriptedModel([call("Bash", command="touch ran.marker"), "done"])
    result = await Agent(model, tools=[bash], policy=SafetyPolicy(approver=DenyAll())).arun("make a file")
    assert not (tmp_path / "ran.marker").exists()
    tool_message = next(m for m in result.messages if m.role == "tool")
    assert "approv" in tool_message.content.lower()


@needs_bwrap
async def test_unix_sockets_of_local_daemons_are_out_of_reach(workspace: Path) -> None:
    """A network namespace does not stop connect() on a socket file (docker, dbus and databases
    listen under /run); the sandbox hides /run."""
    import socket as sock

    path = Path(f"/run/tether-probe-{os.getpid()}.sock")
    server = sock.socket(sock.AF_UNIX)
    try:
        server.bind(str(path))
    except OSError as exc:
        pytest.skip(f"cannot create a socket under /run here: {exc}")
    server.listen(1)
    try:
        probe = f"python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{path}'); print('connected')\""
        assert "connected" not in await run(shell_tool(workspace, sandbox=Bubblewrap(workspace)), probe)
        assert "connected" in await run(shell_tool(workspace, sandbox=Unconfined()), probe)  # the probe works
    finally:
        server.close()
        path.unlink(missing_ok=True)
