"""Where a shell command runs and what it may touch: the `Sandbox` protocol and bubblewrap.

`Bubblewrap` gives each command the guarantees of Claude Code's Linux sandbox (bubblewrap too), and
more, each one an allowlist or a kernel guarantee rather than a list of known-bad things:

- it runs as an unprivileged user with no capabilities, `no_new_privs`, and every mount `nosuid`
  and `nodev` (the workspace included): as a normal user, as that user in a new user namespace;
  when tether runs as root, as the workspace's owner, or `nobody` (65534) when root owns it too
  (the workspace then mounted id-mapped, so nobody can write it and what it writes is root's:
  tools/_idmap.py), so it can neither read root-only files such as /etc/shadow nor leave a
  setuid-root binary behind;
- it sees an allowlist of the host, not the host minus a list: the sandbox's root is empty and
  only these are mounted, read-only unless said: the toolchain (`TOOLCHAIN`: /usr, and /bin, /lib
  ... as the host has them, symlinks into /usr included; plus the Python installation tether runs
  on when it lies elsewhere, so a venv made with it works), the parts of /etc programs read
  (`ETC_READABLE`, and `ETC_NETWORK` only with `allow_net`; passwd, group and, without network,
  hosts are generated, naming only root, nobody and the command's user), a fresh /dev and /proc,
  an empty private /tmp (HOME is /tmp/home), /var/tmp and /dev/shm, the paths named in `readable`
  (`--sandbox-read`, `$TETHER_SANDBOX_READ`), and the workspace, writable, with the directories
  on the way to it as empty directories (the sandbox's own root is read-only). /home, /root, /opt,
  /srv, /var, /mnt, /run (its sockets), /sys and the rest of /etc are not there at all, so a
  secret outside the workspace cannot be read nor a local daemon reached; `hidden` paths inside
  what is mounted are replaced by an empty directory (or /dev/null for a file);
- inside the workspace the paths that run code later, outside the sandbox (`executed_later`: the
  whole `.git`, submodules' `.git` included, plus what the user adds) are read-only mounts, which
  can be neither written, nor renamed, nor removed; `writable` paths are bound writable;
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
import glob
import grp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
# What of the host a command may read: the programs and libraries. /bin, /sbin and /lib* are symlinks
# into /usr on merged-/usr systems and are reproduced as such; the missing ones are skipped.
TOOLCHAIN = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc they read (measured with strace on bash, coreutils, git, python3, pytest, gcc, g++, make,
# javac, java, node, perl; and the targets of /usr's symlinks into /etc): the dynamic linker, name
# service, time zone, alternatives, language runtimes' settings. Never credentials or host names:
# gitconfig, pip.conf, npmrc, hostname, machine-id, shadow stay out.
ETC_READABLE = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "timezone", "alternatives",
    "java-*", "maven", "python3*", "perl", "groff", "locale.alias", "locale.conf", "mime.types", "magic",
    "magic.mime", "gitattributes", "bash.bashrc", "profile", "profile.d", "inputrc", "terminfo", "fonts",
    "os-release", "debian_version", "lsb-release", "protocols", "services", "shells", "ssl/openssl.cnf",
    "mtab",
)
# Only with the network: name resolution and certificate authorities.
ETC_NETWORK = ("resolv.conf", "hosts", "host.conf", "gai.conf", "ssl/certs", "ca-certificates",
               "ca-certificates.conf", "pki")
READ_ENV = "TETHER_SANDBOX_READ"  # more read-only paths, separated by ':' (the CLI's --sandbox-read)
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

    `toolchain`: the host paths commands read their programs from (default: `default_toolchain()`);
    `readable`: more host paths mounted read-only (a toolchain elsewhere: /opt/node, ~/.cargo ...);
    `hidden`: paths inside those replaced by an empty directory (or /dev/null for a file);
    `writable`: more paths bind-mounted writable; `executed_later`: more workspace paths kept read-only
    (added to EXECUTED_LATER); `allow_net`: share the host's network; `run_as`: the (uid, gid)
    commands run as when tether runs as root (default: the workspace's owner, or nobody when that is
    root). Paths are resolved; those missing here are skipped.
    """

    workspace: Path
    allow_net: bool = False
    hidden: Sequence[str | Path] = ()
    writable: Sequence[str | Path] = ()
    readable: Sequence[str | Path] = ()
    toolchain: Sequence[str | Path] | None = None
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
        return [Path(p).resolve() for p in self.hidden]

    def toolchain_paths(self) -> list[Path]:
        toolchain = default_toolchain() if self.toolchain is None else self.toolchain
        return [Path(os.path.abspath(p)) for p in dict.fromkeys(toolchain)]

    def readable_paths(self) -> list[Path]:
        return [Path(os.path.abspath(p)) for p in dict.fromkeys(self.readable)]

    def unseen_interpreters(self) -> list[tuple[Path, Path]]:
        """The workspace's virtual environments (a pyvenv.cfg one level down) whose Python the sandbox
        does not show, with that Python's prefix. Read to advise the user only: nothing the workspace
        says widens what is mounted."""
        ws = self.workspace.resolve()
        shown = [ws, *(p.resolve() for p in [*self.toolchain_paths(), *self.readable_paths()] if p.exists())]
        out: list[tuple[Path, Path]] = []
        for cfg in sorted(ws.glob("*/pyvenv.cfg")):
            try:
                lines = cfg.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            pairs = (line.partition("=") for line in lines)
            home = next((v.strip() for k, _, v in pairs if k.strip() == "home"), "")
            if not home.startswith("/"):
                continue
            where = Path(os.path.normpath(home))
            prefix = where.parent if where.name == "bin" else where
            if not any(where == p or where.resolve().is_relative_to(p) for p in shown):
                out.append((cfg.parent, prefix))
        return out

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
        who = self.identity()
        root = who is not None
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
        tree = _Tree()  # from an empty root: what is not mounted here does not exist for the command
        for path in self.toolchain_paths():
            tree.read(path)
        self._etc(tree, who or (os.getuid(), os.getgid()))
        if self.allow_net:
            tree.read(Path("/run/systemd/resolve"))  # where /etc/resolv.conf may point: DNS for --allow-net
        tree.fresh("--dev", Path("/dev"))
        tree.fresh("--proc", Path("/proc"))
        tree.tmpfs(Path("/dev/shm"), "1777")  # POSIX semaphores and shared memory (multiprocessing)
        tree.tmpfs(Path("/tmp"), "1777")
        tree.tmpfs(Path("/var/tmp"), "1777")
        # as root the private HOME is made by root for the unprivileged user: open to it (and only it runs there)
        tree.made(Path(SANDBOX_HOME), "0777" if root else "0700")
        for path in self.readable_paths():  # after /tmp's tmpfs, so that a path under /tmp can be named too
            tree.read(path)
        hidden = [p for p in sorted(set(self.hidden_paths()), key=lambda p: len(p.parts)) if p != Path("/")]
        for path in hidden:  # an ancestor of the workspace first, the workspace then bound back on top
            if path == ws or path in ws.parents:
                tree.hide(path)
        # The workspace: the one view of the user's files, writable (a run's staged view, when it has one).
        tree.bind(source or self.view or ws, ws, "--bind")
        for extra in self.writable:
            p = Path(extra).resolve()
            if p.exists():
                tree.bind(p, p, "--bind")
        for path in hidden:  # anything else (also inside the workspace) after the binds
            if not (path == ws or path in ws.parents):
                tree.hide(path)
        for p in self.protected_paths():
            tree.bind(p, p, "--ro-bind")
        # the sandbox's own root (the directories and links made above) read-only too, as the host's is
        return [*out, *tree.args, "--remount-ro", "/"]

    def _etc(self, tree: _Tree, who: tuple[int, int]) -> None:
        """The allowlisted parts of the host's /etc, and generated passwd, group (and hosts offline)."""
        names = [*ETC_READABLE, *(ETC_NETWORK if self.allow_net else ())]
        for path in sorted({Path(p) for name in names for p in glob.glob(f"/etc/{name}")}):
            tree.read(path)
        made = _generated_etc(*who)
        for name in ("passwd", "group", *(() if self.allow_net else ("hosts",))):
            tree.bind(made / name, Path("/etc") / name, "--ro-bind")

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


def default_toolchain() -> tuple[str, ...]:
    """TOOLCHAIN, and the Python installation tether runs on (`sys.base_prefix`) when it lies outside
    /usr (pyenv, conda, /opt): a virtual environment made with it then works in the sandbox. Not
    when that prefix would hold the user's home directory."""
    prefix = Path(sys.base_prefix).resolve()
    home = Path.home().resolve()
    if prefix == Path("/") or prefix == home or prefix in home.parents:
        return TOOLCHAIN
    return (*TOOLCHAIN, str(prefix))


class _Tree:
    """bwrap options that build the sandbox's tree from an empty root, remembering what each path
    shows, so that the directories on the way to a mount are made once, traversable (bwrap would
    copy the host's modes: 0700 for /root, a private temporary directory ...)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._mounts: list[tuple[Path, str]] = []  # in order; the last one covering a path is what it shows
        self._made: set[Path] = set()

    def _shown(self, path: Path) -> str | None:
        for mount, kind in reversed(self._mounts):
            if path == mount or path.is_relative_to(mount):
                return kind
        return None

    def _mount(self, path: Path, kind: str) -> None:
        self._mounts.append((path, kind))
        self._made = {p for p in self._made if not p.is_relative_to(path)} | {path}

    def _parents(self, path: Path) -> None:
        for parent in sorted(path.parents, key=lambda p: len(p.parts))[1:]:
            if parent not in self._made and self._shown(parent) not in ("--ro-bind", "--bind"):
                self.made(parent, "0755")

    def made(self, path: Path, perms: str) -> None:
        """An empty directory."""
        self._parents(path)
        self.args += ["--perms", perms, "--dir", str(path)]
        self._made.add(path)

    def bind(self, source: Path, dest: Path, how: str) -> None:
        """Mount `source` at `dest`; `how`: --bind (writable) or --ro-bind."""
        self._parents(dest)
        self.args += [how, str(source), str(dest)]
        self._mount(dest, how)

    def fresh(self, how: str, path: Path) -> None:
        """A new /dev (--dev) or /proc (--proc)."""
        self.args += [how, str(path)]
        self._mount(path, how)

    def tmpfs(self, path: Path, perms: str) -> None:
        self._parents(path)
        self.args += ["--perms", perms, "--tmpfs", str(path)]
        self._mount(path, "--tmpfs")

    def read(self, path: Path) -> None:
        """The host's `path` at the same place, read-only; a symlink stays a symlink when what it points
        to is in the sandbox (/bin -> usr/bin), else its target's content is mounted there."""
        if not path.exists() or path == Path("/"):
            return
        real = path.resolve()
        if path.is_symlink():
            text = os.readlink(path)
            target = Path(os.path.normpath(path.parent / text))
            # the link as it is when what it names is there; else straight to where it leads, when that is
            if target.parts[:2] == ("/", "proc") or self._shown(target) == "--ro-bind":
                self._symlink(text, path)
                return
            if self._shown(real) == "--ro-bind":
                self._symlink(str(real), path)
                return
            if target == real and real.is_dir():  # bound at its own place, the link to it beside
                self.read(real)
                self.read(path)
                return
        if self._shown(path) != "--ro-bind" or real != path:
            self.bind(real, path, "--ro-bind")

    def _symlink(self, text: str, path: Path) -> None:
        if path not in self._made:
            self._parents(path)
            self.args += ["--symlink", text, str(path)]
            self._made.add(path)

    def hide(self, path: Path) -> None:
        """An empty directory (or /dev/null for a file) over `path` when the sandbox shows it."""
        if self._shown(path) not in ("--ro-bind", "--bind") or not path.exists() or path.is_symlink():
            return
        if path.is_dir():
            self.tmpfs(path, "0755")
        else:
            self.bind(Path("/dev/null"), path, "--ro-bind")


_etc_dirs: dict[tuple[int, int], Path] = {}


def _generated_etc(uid: int, gid: int) -> Path:
    """A directory holding passwd, group and hosts for the sandbox: root, nobody and the command's
    user (whose home is the sandbox's), localhost; nothing of the host's other accounts."""
    made = _etc_dirs.get((uid, gid))
    if made is not None and all((made / n).is_file() for n in ("passwd", "group", "hosts")):
        return made
    made = Path(tempfile.mkdtemp(prefix="tether-etc-"))
    atexit.register(shutil.rmtree, made, True)
    user, group = _name(pwd.getpwuid, uid, "user"), _name(grp.getgrgid, gid, "users")
    users = {0: "root:x:0:0:root:/root:/bin/bash",
             NOBODY: f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin",
             uid: f"{user}:x:{uid}:{gid}:{user}:{SANDBOX_HOME}:/bin/bash"}
    groups = {0: "root:x:0:", NOBODY: f"nogroup:x:{NOBODY}:", gid: f"{group}:x:{gid}:"}
    host = _safe(os.uname().nodename, "localhost")
    hosts = f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{host}\n"
    files = {"passwd": "\n".join(users.values()), "group": "\n".join(groups.values()),
             "hosts": hosts.rstrip()}
    for name, text in files.items():
        (made / name).write_text(text + "\n", encoding="utf-8")
        (made / name).chmod(0o644)
    made.chmod(0o755)
    _etc_dirs[(uid, gid)] = made
    return made


def _name(lookup: Callable[[int], Any], number: int, default: str) -> str:
    try:
        return _safe(lookup(number)[0], default)
    except KeyError:
        return default


def _safe(name: str, default: str) -> str:
    return name if name and all(c.isalnum() or c in "._-" for c in name) else default


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
    readable: Sequence[str | Path] = (),
    warn: Callable[[str], None] | None = None,
    bwrap: str | None = None,
    environ: Mapping[str, str] | None = None,
    view: Path | None = None,
) -> Sandbox:
    """Bubblewrap when it works on this machine; otherwise `Unconfined`, said once per process on
    stderr (or through `warn`). `bwrap`: the binary (default: `bwrap` on PATH). `readable` gets the
    paths of $TETHER_SANDBOX_READ (in `environ`, default this process's) added. `view`: a run's staged
    view, mounted at the workspace's path."""
    path = bwrap or shutil.which("bwrap")
    reason = probe_bubblewrap(path) if path else "bubblewrap (bwrap) is not installed"
    if reason is None and path is not None:
        listed = (os.environ if environ is None else environ).get(READ_ENV, "")
        readable = [*readable, *(p for p in listed.split(os.pathsep) if p.strip())]
        box = Bubblewrap(Path(workspace), allow_net=allow_net, hidden=tuple(hidden), writable=tuple(writable),
                         readable=tuple(readable), executed_later=tuple(executed_later), bwrap=path,
                         setpriv=shutil.which("setpriv") or "setpriv", view=view)
        for venv, prefix in box.unseen_interpreters():
            (warn or _stderr)(f"tether: {venv.name} in the workspace runs the Python in {prefix}, which "
                              f"Bash's sandbox does not show: give --sandbox-read {prefix} to use it there.")
        return box
    reason = reason or "bubblewrap (bwrap) is not installed"
    if reason not in _warned:
        _warned.add(reason)
        (warn or _stderr)(f"tether: Bash is not sandboxed ({reason}); every Bash call needs approval. "
                          f"To confine it, {INSTALL_HINT}.")
    return Unconfined()


__all__ = [
    "ENV_ALLOWLIST",
    "ETC_NETWORK",
    "ETC_READABLE",
    "EXECUTED_LATER",
    "READ_ENV",
    "TOOLCHAIN",
    "Bubblewrap",
    "Launch",
    "Sandbox",
    "Unconfined",
    "default_sandbox",
    "default_toolchain",
    "probe_bubblewrap",
    "sandbox_environ",
]
