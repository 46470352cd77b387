"""Where a shell command runs and what it may touch: the `Sandbox` protocol and bubblewrap.

`Bubblewrap` gives each command the guarantees of Claude Code's Linux sandbox (bubblewrap too), and
more, each one an allowlist or a kernel guarantee rather than a list of known-bad things:

- it runs as an unprivileged user with no capabilities, `no_new_privs`, and every mount `nosuid`
  and `nodev` (the workspace included): as a normal user, as that user in a new user namespace;
  when tether runs as root, as the workspace's owner, or `nobody` (65534) when root owns it too
  (the workspace then mounted id-mapped, so nobody can write it and what it writes is root's:
  tools/_idmap.py), so it can neither read root-only files such as /etc/shadow nor leave a
  setuid-root binary behind;
- the filesystem is read-only, except the workspace (bind-mounted writable) and `writable` paths;
  inside the workspace the paths that run code later, outside the sandbox (`executed_later`:
  the whole `.git`, submodules' `.git` included, plus what the user adds) are read-only mounts,
  which can be neither written, nor renamed, nor removed;
- the user's home, /root, /run (its unix sockets: docker, dbus, databases) and `hidden` paths are
  replaced by empty directories, /tmp and /var/tmp are private and empty, so a secret outside the
  workspace cannot be read nor a local daemon reached;
- its own PID namespace with its own /proc (`/proc/$PPID/environ` is the sandbox's own), its own
  IPC, UTS and network namespaces: no network but loopback unless `allow_net`;
- a new session (no TIOCSTI into the user's terminal), `--die-with-parent`;
- the environment is an allowlist (`sandbox_environ`: PATH, locale, TERM, a private HOME and
  TMPDIR, and the names the user passes), and bwrap itself starts with it only, so no process in
  the sandbox (bwrap's pid 1 included) holds the parent's variables.

`Unconfined` runs commands as they are; `default_sandbox()` picks bubblewrap when it works here
and otherwise says once on stderr why not (the Bash tool then asks approval for every call).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tether.tools._idmap import idmapped_view
from tether.tools._seccomp import filter_fd, no_setid_filter

# What a command's environment may hold, by name; anything else only when the user names it (--env).
ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ")
SANDBOX_HOME = "/tmp/home"  # inside bubblewrap's private /tmp
NOBODY = 65534
# Inside a writable workspace these stay read-only: written there, they run code later, outside the
# sandbox (git hooks, core.fsmonitor, core.pager, submodules' configs ...). Users add more with
# `executed_later=` (the CLI's --protect).
EXECUTED_LATER = (".git",)
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"


def sandbox_environ(pass_env: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A command's environment: the ENV_ALLOWLIST names and those in `pass_env`, from `environ`
    (default: this process's). Nothing else of the parent's environment is passed on; HOME and
    TMPDIR are the sandbox's own (set by `Sandbox.launch`)."""
    source = os.environ if environ is None else environ
    return {k: source[k] for k in dict.fromkeys([*ENV_ALLOWLIST, *pass_env]) if k in source}


@dataclass(frozen=True, slots=True)
class Launch:
    """The process to start for one command: its argv and its whole environment, and what to undo
    once it has ended (`cleanup`)."""

    argv: list[str]
    env: dict[str, str]
    cleanup: Callable[[], None] | None = None
    pass_fds: tuple[int, ...] = ()  # descriptors the process inherits (bwrap's --seccomp)


class Sandbox(Protocol):
    """Turns `bash -c COMMAND` in a directory into the process that runs it confined."""

    @property
    def confined(self) -> bool:  # False: nothing is enforced, so every call should be approved
        ...

    @property
    def description(self) -> str:  # one line for tool descriptions and `tether models`
        ...

    def launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> Launch: ...


_private_home: list[str] = []


def _unconfined_home() -> str:
    """A private HOME for unconfined commands (made once per process): the user's dotfiles and
    credentials are not where a command looks for them."""
    if not _private_home:
        _private_home.append(tempfile.mkdtemp(prefix="tether-home-"))
        atexit.register(shutil.rmtree, _private_home[0], True)
    return _private_home[0]


class Unconfined:
    """No sandbox: the command runs as the user, in `cwd`, with the environment given (and a private
    HOME unless the environment names one)."""

    confined = False
    description = "not sandboxed"

    def launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> Launch:
        return Launch(list(argv), {"HOME": _unconfined_home(), **env})


@dataclass(slots=True)
class Bubblewrap:
    """A bubblewrap sandbox around one workspace (see the module docstring for what it enforces).

    `hidden`: more paths replaced by an empty directory (or /dev/null for a file); `writable`:
    more paths bind-mounted writable; `executed_later`: more workspace paths kept read-only (added
    to EXECUTED_LATER); `allow_net`: share the host's network; `run_as`: the (uid, gid) commands run
    as when tether runs as root (default: the workspace's owner, or nobody when that is root).
    """

    workspace: Path
    allow_net: bool = False
    hidden: Sequence[str | Path] = ()
    writable: Sequence[str | Path] = ()
    executed_later: Sequence[str | Path] = ()
    run_as: tuple[int, int] | None = None
    view: Path | None = None  # mounted writable at the workspace's path instead of it (a run's staged view)
    bwrap: str = "bwrap"
    setpriv: str = "setpriv"
    confined: bool = field(default=True, init=False)

    @property
    def description(self) -> str:
        net = "network allowed" if self.allow_net else "no network"
        who = self.identity()
        if self._root_owned() and not _idmap_works(self.workspace):
            return (f"sandboxed (bubblewrap): commands run as nobody and cannot write {self.workspace}, which "
                    f"belongs to root (run tether as the workspace's owner to let them), {net}")
        user = "" if who is None else f", commands run as uid {who[0]}"
        return f"sandboxed (bubblewrap): only {self.workspace} is writable, {net}{user}"

    def identity(self) -> tuple[int, int] | None:
        """(uid, gid) to drop to inside the sandbox when tether runs as root; None when it does not
        (bwrap then runs as this unprivileged user, in a user namespace)."""
        if os.geteuid() != 0:
            return None
        if self.run_as is not None:
            return self.run_as
        try:
            owner = os.stat(self.workspace)
        except OSError:
            return (NOBODY, NOBODY)
        if owner.st_uid == 0:
            return (NOBODY, NOBODY)
        return (owner.st_uid, owner.st_gid or NOBODY)

    def hidden_paths(self) -> list[Path]:
        home = Path.home()
        # /run holds unix sockets (docker, dbus, postgres) that a read-only mount and a network
        # namespace leave connectable; hidden, they are gone.
        paths = [Path(p) for p in ("/root", "/var/tmp", "/run")] + [Path(p) for p in self.hidden]
        if home != Path("/"):
            paths.insert(0, home)
        return [p.resolve() for p in paths]

    def protected_paths(self) -> list[Path]:
        """The existing workspace paths kept read-only: EXECUTED_LATER and `executed_later`, and each
        submodule's `.git` (a file pointing into .git/modules, or a directory)."""
        ws = self.workspace.resolve()
        names = [*EXECUTED_LATER, *(str(p) for p in self.executed_later)]
        for sub in _submodule_paths(ws):
            # its .git (file or directory); not checked out yet, the (empty) directory itself, so that
            # no .git pointing at a planted config can appear there
            names.append(f"{sub}/.git" if os.path.lexists(ws / sub / ".git") else sub)
        out: list[Path] = []
        for name in dict.fromkeys(names):
            p = Path(os.path.normpath(ws / name))
            # lexists + not a link: a symlink would make bwrap mount its target instead
            if (p == ws or p.is_relative_to(ws)) and os.path.lexists(p) and not p.is_symlink():
                out.append(p)
        return out

    def _root_owned(self) -> bool:
        """tether runs as root on a workspace root owns, and commands run as nobody."""
        who = self.identity()
        return who is not None and who[0] == NOBODY and _owner(self.workspace) == 0

    def args(self, source: Path | None = None) -> list[str]:
        """bwrap's options, without the command. `source`: what to mount at the workspace (default:
        the workspace itself; an id-mapped view of it for a root-owned one)."""
        ws = self.workspace.resolve()
        root = self.identity() is not None
        if root:
            # bwrap stays root to set up the mounts; the command drops to the unprivileged user (setpriv)
            out = ["--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
                   "--unshare-cgroup-try"]
            if not self.allow_net:
                out.append("--unshare-net")
        else:
            out = ["--die-with-parent", "--new-session", "--unshare-all", "--unshare-user", "--disable-userns",
                   "--cap-drop", "ALL"]
            if self.allow_net:
                out.append("--share-net")
        # as root the private HOME is made by root for the unprivileged user: open to it (and only it runs there)
        out += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp",
                "--perms", "0777" if root else "0700", "--dir", SANDBOX_HOME]
        after: list[str] = []
        tmpfs: list[Path] = [Path("/tmp")]
        for path in sorted(set(self.hidden_paths()), key=lambda p: len(p.parts)):
            if not path.exists() or path.is_symlink() or path == Path("/"):
                continue
            # An ancestor of the workspace is hidden first, then the workspace is bound back on top;
            # anything else (also inside the workspace) is hidden after the binds.
            target = out if path == ws or path in ws.parents else after
            if path.is_dir():
                target += ["--tmpfs", str(path)]
                tmpfs.append(path)
            else:
                target += ["--ro-bind", "/dev/null", str(path)]
        # The workspace's ancestors inside an empty tmpfs are made traversable (bwrap would copy the
        # host's modes, 0700 for a private temporary directory, and the unprivileged user could not
        # reach the workspace by its absolute path).
        for parent in sorted(ws.parents, key=lambda p: len(p.parts)):
            if any(parent != t and parent.is_relative_to(t) for t in tmpfs):
                out += ["--perms", "0755", "--dir", str(parent)]
        out += ["--bind", str(source or self.view or ws), str(ws)]
        for extra in self.writable:
            p = Path(extra).resolve()
            if p.exists():
                out += ["--bind", str(p), str(p)]
        out += after
        resolver = Path("/run/systemd/resolve")  # where /etc/resolv.conf may point: DNS for --allow-net
        if self.allow_net and resolver.is_dir():
            out += ["--ro-bind", str(resolver), str(resolver)]
        for p in self.protected_paths():
            out += ["--ro-bind", str(p), str(p)]
        return out

    def launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> Launch:
        cwd = cwd.resolve()
        env = {**env, "HOME": SANDBOX_HOME, "TMPDIR": "/tmp"}
        who = self.identity()
        drop: list[str] = []
        if who is not None:
            drop = [self.setpriv, "--reuid", str(who[0]), "--regid", str(who[1]), "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all", "--"]
            env["USER"] = env["LOGNAME"] = "nobody" if who[0] == NOBODY else str(who[0])
        seccomp = filter_fd() if who is not None and self._root_owned() else None
        mounted = self.view or self.workspace.resolve()
        view = idmapped_view(mounted, *who) if who is not None and seccomp is not None else None
        if view is None or seccomp is None:  # the plain workspace, read-only to nobody: no setuid file there
            if seccomp is not None:
                os.close(seccomp)
            return Launch([self.bwrap, *self.args(), "--chdir", str(cwd), *drop, *argv], env)
        # Through the id-mapped view what the command creates is root's on disk: the filter keeps
        # it from making any of it setuid or setgid (tools/_seccomp.py).
        source, remove = view
        fd: int = seccomp

        def cleanup() -> None:
            os.close(fd)
            remove()

        return Launch([self.bwrap, *self.args(source), "--seccomp", str(fd), "--chdir", str(cwd), *drop, *argv],
                      env, cleanup, (fd,))


def _idmap_works(workspace: Path) -> bool:
    """Whether a root-owned workspace can be shown writable to nobody here (see tools/_idmap.py)."""
    if no_setid_filter() is None:
        return False
    view = idmapped_view(workspace.resolve(), NOBODY, NOBODY)
    if view is None:
        return False
    view[1]()
    return True


def _owner(path: Path) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _submodule_paths(ws: Path) -> list[str]:
    """The `path = ...` entries of the workspace's .gitmodules (read by us, never by git)."""
    try:
        text = (ws / ".gitmodules").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out: list[str] = []
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "path" and value.strip() and ".." not in value.strip().split("/"):
            out.append(value.strip().strip('"'))
    return out


# ---- is bubblewrap usable here? ----------------------------------------------------------------

_probed: dict[str, str | None] = {}  # bwrap path -> None (works) or why not
_warned: set[str] = set()


def probe_bubblewrap(bwrap: str | None = None) -> str | None:
    """None if bubblewrap can run a command here the way `Bubblewrap` runs it (namespaces, and the
    drop to an unprivileged user when tether runs as root), else the reason in a few words (cached)."""
    path = bwrap or shutil.which("bwrap")
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    if path in _probed:
        return _probed[path]
    setpriv = shutil.which("setpriv") or "setpriv"
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        reason: str | None = "setpriv (util-linux) is needed to run sandboxed commands as an unprivileged user"
    else:
        with tempfile.TemporaryDirectory(prefix="tether-probe-") as tmp:
            os.chmod(tmp, 0o755)
            launch = Bubblewrap(Path(tmp), bwrap=path, setpriv=setpriv).launch(
                ["true"], cwd=Path(tmp), env={"PATH": "/usr/bin:/bin"})
            try:
                proc = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=10,
                                      check=False, pass_fds=launch.pass_fds)
                last = (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[-1]
                reason = None if proc.returncode == 0 else f"bwrap cannot create its sandbox here: {last}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                reason = f"bwrap cannot start: {exc}"
            finally:
                if launch.cleanup is not None:
                    launch.cleanup()
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
    executed_later: Sequence[str | Path] = (),
    warn: Callable[[str], None] | None = None,
    bwrap: str | None = None,
    view: Path | None = None,
) -> Sandbox:
    """Bubblewrap when it works on this machine; otherwise `Unconfined`, said once per process on
    stderr (or through `warn`). `bwrap`: the binary (default: `bwrap` on PATH); `view`: a run's staged
    view, mounted at the workspace's path."""
    path = bwrap or shutil.which("bwrap")
    reason = probe_bubblewrap(path) if path else "bubblewrap (bwrap) is not installed"
    if reason is None and path is not None:
        return Bubblewrap(Path(workspace), allow_net=allow_net, hidden=tuple(hidden), writable=tuple(writable),
                          executed_later=tuple(executed_later), bwrap=path, setpriv=shutil.which("setpriv") or "setpriv",
                          view=view)
    reason = reason or "bubblewrap (bwrap) is not installed"
    if reason not in _warned:
        _warned.add(reason)
        (warn or _stderr)(f"tether: Bash is not sandboxed ({reason}); every Bash call needs approval. "
                          f"To confine it, {INSTALL_HINT}.")
    return Unconfined()


__all__ = [
    "ENV_ALLOWLIST",
    "EXECUTED_LATER",
    "Bubblewrap",
    "Launch",
    "Sandbox",
    "Unconfined",
    "default_sandbox",
    "probe_bubblewrap",
    "sandbox_environ",
]
