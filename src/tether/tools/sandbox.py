"""Where a shell command runs and what it may touch: the `Sandbox` protocol and bubblewrap.

`Bubblewrap` gives each command the guarantees of Claude Code's Linux sandbox (bubblewrap too):

- the filesystem is read-only, except the workspace (bind-mounted writable) and `writable` paths;
  inside the workspace `.git/hooks` and `.git/config` stay read-only (a hook written by an
  injected command would run at the user's next commit);
- the user's home, /root, /run (its unix sockets: docker, dbus, databases) and `hidden` paths are
  replaced by empty directories, /tmp and /var/tmp are private and empty, so a secret outside the
  workspace cannot be read nor a local daemon reached;
- its own PID namespace with its own /proc (`/proc/$PPID/environ` is the sandbox's own), its own
  IPC, UTS and network namespaces: no network but loopback unless `allow_net`;
- no capabilities, a new session (no TIOCSTI into the user's terminal), `--die-with-parent`;
- bwrap itself starts with the command's scrubbed environment only, so no process in the
  sandbox (bwrap's pid 1 included) holds the parent's variables.

`Unconfined` runs commands as they are; `default_sandbox()` picks bubblewrap when it works here
and otherwise says once on stderr why not (the Bash tool then asks approval for every call).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION|COOKIE)", re.IGNORECASE)
_SECRET_VALUE = re.compile(r"://[^/\s:@]+:[^/\s@]+@")  # credentials inside a URL (postgres://u:p@host)
# Inside a writable workspace these stay read-only: written there, they run code later, outside the sandbox.
PROTECTED_IN_WORKSPACE = (".git/hooks", ".git/config")
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"


def scrubbed_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment minus variables that look like secrets: names such as *_API_KEY, *TOKEN*,
    *PASSWORD*, and values carrying credentials in a URL."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if not _SECRET_NAME.search(k) and not _SECRET_VALUE.search(v)}


@dataclass(frozen=True, slots=True)
class Launch:
    """The process to start for one command: its argv and its whole environment."""

    argv: list[str]
    env: dict[str, str]


class Sandbox(Protocol):
    """Turns `bash -c COMMAND` in a directory into the process that runs it confined."""

    confined: bool  # False: nothing is enforced, so every call should be approved
    description: str  # one line for tool descriptions and `tether models`

    def launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> Launch: ...


class Unconfined:
    """No sandbox: the command runs as the user, in `cwd`, with the environment given."""

    confined = False
    description = "not sandboxed"

    def launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> Launch:
        return Launch(list(argv), dict(env))


@dataclass(slots=True)
class Bubblewrap:
    """A bubblewrap sandbox around one workspace (see the module docstring for what it enforces).

    `hidden`: more paths replaced by an empty directory (or /dev/null for a file); `writable`:
    more paths bind-mounted writable; `allow_net`: share the host's network.
    """

    workspace: Path
    allow_net: bool = False
    hidden: Sequence[str | Path] = ()
    writable: Sequence[str | Path] = ()
    bwrap: str = "bwrap"
    confined: bool = field(default=True, init=False)

    @property
    def description(self) -> str:
        net = "network allowed" if self.allow_net else "no network"
        return f"sandboxed (bubblewrap): only {self.workspace} is writable, {net}"

    def hidden_paths(self) -> list[Path]:
        home = Path.home()
        # /run holds unix sockets (docker, dbus, postgres) that a read-only mount and a network
        # namespace leave connectable; hidden, they are gone.
        paths = [Path(p) for p in ("/root", "/var/tmp", "/run")] + [Path(p) for p in self.hidden]
        if home != Path("/"):
            paths.insert(0, home)
        return [p.resolve() for p in paths]

    def args(self) -> list[str]:
        """bwrap's options, without the command."""
        ws = self.workspace.resolve()
        out = ["--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL"]
        if self.allow_net:
            out.append("--share-net")
        out += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        after: list[str] = []
        for path in sorted(set(self.hidden_paths()), key=lambda p: len(p.parts)):
            if not path.exists() or path.is_symlink() or path == Path("/"):
                continue
            # An ancestor of the workspace is hidden first, then the workspace is bound back on top;
            # anything else (also inside the workspace) is hidden after the binds.
            target = out if path == ws or path in ws.parents else after
            if path.is_dir():
                target += ["--tmpfs", str(path)]
            else:
                target += ["--ro-bind", "/dev/null", str(path)]
        out += ["--bind", str(ws), str(ws)]
        for extra in self.writable:
            p = Path(extra).resolve()
            if p.exists():
                out += ["--bind", str(p), str(p)]
        out += after
        resolver = Path("/run/systemd/resolve")  # where /etc/resolv.conf may point: DNS for --allow-net
        if self.allow_net and resolver.is_dir():
            out += ["--ro-bind", str(resolver), str(resolver)]
        for rel in PROTECTED_IN_WORKSPACE:
            p = ws / rel
            if p.exists() and not p.is_symlink():
                out += ["--ro-bind", str(p), str(p)]
        return out

    def launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> Launch:
        cwd = cwd.resolve()
        return Launch([self.bwrap, *self.args(), "--chdir", str(cwd), *argv], dict(env))


# ---- is bubblewrap usable here? ----------------------------------------------------------------

_probed: dict[str, str | None] = {}  # bwrap path -> None (works) or why not
_warned: set[str] = set()


def probe_bubblewrap(bwrap: str | None = None) -> str | None:
    """None if bubblewrap can create its namespaces here, else the reason in a few words (cached)."""
    path = bwrap or shutil.which("bwrap")
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    if path in _probed:
        return _probed[path]
    try:
        proc = subprocess.run(
            [path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", "true"],
            env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=10, check=False,
        )
        reason = None if proc.returncode == 0 else (
            f"bwrap cannot create its namespaces here: {(proc.stderr.strip().splitlines() or ['exit ' + str(proc.returncode)])[-1]}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = f"bwrap cannot start: {exc}"
    _probed[path] = reason
    return reason


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def default_sandbox(
    workspace: str | Path,
    *,
    allow_net: bool = False,
    hidden: Sequence[str | Path] = (),
    writable: Sequence[str | Path] = (),
    warn: Callable[[str], None] | None = None,
    bwrap: str | None = None,
) -> Sandbox:
    """Bubblewrap when it works on this machine; otherwise `Unconfined`, said once per process on
    stderr (or through `warn`). `bwrap`: the binary (default: `bwrap` on PATH)."""
    path = bwrap or shutil.which("bwrap")
    reason = probe_bubblewrap(path) if path else "bubblewrap (bwrap) is not installed"
    if reason is None and path is not None:
        return Bubblewrap(Path(workspace), allow_net=allow_net, hidden=tuple(hidden), writable=tuple(writable),
                          bwrap=path)
    reason = reason or "bubblewrap (bwrap) is not installed"
    if reason not in _warned:
        _warned.add(reason)
        (warn or _stderr)(f"tether: Bash is not sandboxed ({reason}); every Bash call needs approval. "
                          f"To confine it, {INSTALL_HINT}.")
    return Unconfined()


__all__ = [
    "Bubblewrap",
    "Launch",
    "Sandbox",
    "Unconfined",
    "default_sandbox",
    "probe_bubblewrap",
    "scrubbed_environ",
]
