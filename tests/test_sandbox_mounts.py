"""The sandbox mounts an allowlist: a command reads nothing of the host but the toolchain, the parts
of /etc programs need, the paths the user names (`readable`, --sandbox-read, $TETHER_SANDBOX_READ)
and the workspace; and ordinary work (bash, coreutils, git, python3, pytest from the workspace's
venv, compilers) still runs. Real bubblewrap, secrets planted in real host directories; skipped
without bubblewrap, failed under CI=true."""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need_bubblewrap
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from hang import HANG

from tether.tools._base import Tool
from tether.tools._sandbox import (
    ETC_NETWORK,
    ETC_READABLE,
    READ_ENV,
    TOOLCHAIN,
    Bubblewrap,
    default_sandbox,
    default_toolchain,
)
from tether.tools.builtin import shell_tool

REPO = Path(__file__).resolve().parents[1]
ROOT = os.geteuid() == 0


@pytest.fixture
def bwrap() -> None:
    need_bubblewrap()


async def sh(tool: Tool, command: str) -> str:
    return await tool.fn(**tool.validator.validate({"command": command}))


def for_commands(path: Path) -> Path:
    """`path` and what is in it owned by the user commands run as when the tests run as root (nobody)."""
    if ROOT:
        for p in [path, *path.rglob("*")]:
            os.lchown(p, 65534, 65534)
    return path


class Planted:
    """World-readable secrets in host directories outside the allowlist, and a workspace with a
    sibling, all outside /tmp (whose private tmpfs would hide them anyway). Removed afterwards."""

    def __init__(self, base: Path) -> None:
        tag = f"tether-probe-{uuid.uuid4().hex[:8]}"
        self.tag = tag
        self.dirs: list[Path] = []
        self.secrets: dict[Path, str] = {}
        # where: every usual place that is not the toolchain; those this user cannot write are skipped
        spots = [Path("/opt") / tag, Path("/srv") / tag, Path("/var/lib") / tag, Path("/mnt") / tag,
                 Path("/home") / tag / ".ssh", Path("/media") / tag, Path.home() / tag]
        for i, spot in enumerate(spots):
            if self._plant(spot, f"SECRET-{i}-{tag}"):
                self.dirs.append(spot if spot.parent.name != tag else spot.parent)
        etc = Path("/etc") / f"{tag}.conf"  # a file of /etc that is not on the list
        if os.access("/etc", os.W_OK):
            etc.write_text(f"SECRET-etc-{tag}\n")
            etc.chmod(0o644)
            self.dirs.append(etc)
            self.secrets[etc] = f"SECRET-etc-{tag}"
        self.root = base / tag
        self.workspace = self.root / "ws"
        self.workspace.mkdir(parents=True)
        self.dirs.append(self.root)
        (self.root / "sibling").mkdir()
        (self.root / "sibling" / "notes.txt").write_text(f"SECRET-sibling-{tag}\n")
        self.secrets[self.root / "sibling" / "notes.txt"] = f"SECRET-sibling-{tag}"
        for p in [self.root, *self.root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        for_commands(self.workspace)

    def _plant(self, spot: Path, secret: str) -> bool:
        try:
            spot.mkdir(parents=True, exist_ok=False)
        except OSError:
            return False
        for p in (spot, *spot.parents):
            if p.name.startswith(self.tag) or p == spot:
                p.chmod(0o755)
        (spot / "secret.txt").write_text(secret + "\n")
        (spot / "secret.txt").chmod(0o644)
        self.secrets[spot / "secret.txt"] = secret
        return True

    def remove(self) -> None:
        for p in self.dirs:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


@pytest.fixture
def planted(bwrap: None) -> Iterator[Planted]:
    # a workspace outside /tmp: /srv (or the home directory) is not on the list, so its sibling is a host file
    base = Path("/srv") if os.access("/srv", os.W_OK) else Path.home()
    spot = Planted(base)
    try:
        yield spot
    finally:
        spot.remove()


def probe_reads(planted: Planted) -> str:
    """A command that tries every planted secret by path, and lists the directories around them."""
    paths = " ".join(str(p) for p in planted.secrets)
    parents = " ".join(sorted({str(p.parent) for p in planted.secrets}))
    return (f"cat {paths} 2>&1; ls -a {parents} 2>&1; grep -rs SECRET- /opt /srv /var /mnt /media /home /etc "
            f"{planted.root} 2>/dev/null | head -5; echo LISTED; ls -a {planted.root}; echo END")


async def test_a_command_reads_nothing_of_the_host_outside_its_allowlist(planted: Planted) -> None:
    ws = planted.workspace
    bash = shell_tool(ws, timeout=HANG, sandbox=Bubblewrap(ws))
    out = await sh(bash, probe_reads(planted))
    assert planted.secrets, "nothing could be planted"
    for path, secret in planted.secrets.items():
        assert secret not in out, f"{path} was readable: {out}"
    # the way to the workspace is there, as empty directories: the workspace, not its sibling
    listed = out.split("LISTED\n", 1)[1].split("END", 1)[0].split()
    assert sorted(listed) == [".", "..", "ws"], out
    # /etc holds what is on the list and nothing else (the files generated for the sandbox included)
    names = (await sh(bash, "ls -A /etc")).split()
    allowed = [*ETC_READABLE, "passwd", "group", "hosts", "ssl"]
    assert names and all(any(fnmatch.fnmatch(n, pat.split("/")[0]) for pat in allowed) for n in names), names
    assert "shadow" not in names and "gitconfig" not in names
    top = set((await sh(bash, "ls -A /")).split())
    assert not top & {"home", "opt", "srv", "mnt", "media", "boot", "run"} - {planted.root.parts[1]}, top
    assert "lib" not in (await sh(bash, "ls -A /var")).split()  # /var holds only a private tmp


async def test_only_the_sandbox_user_and_root_are_named(planted: Planted) -> None:
    bash = shell_tool(planted.workspace, timeout=HANG, sandbox=Bubblewrap(planted.workspace))
    out = await sh(bash, "cut -d: -f1,3,6 /etc/passwd; echo; cat /etc/hosts; id -un; "
                         "touch /etc/x / 2>&1 | head -1")
    users = out.split("\n\n", 1)[0].splitlines()
    assert {u.split(":")[1] for u in users} <= {"0", "65534", str(os.getuid())}, users
    assert "localhost" in out and "Read-only file system" in out


def copy_pytest_into(venv: Path) -> None:
    """pytest and what it imports, copied into `venv`'s site-packages: the workspace's own venv."""
    site = next((venv / "lib").glob("python3*")) / "site-packages"
    for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, site / origin.parent.name)
        else:
            shutil.copy2(origin, site / origin.name)


async def test_ordinary_work_still_runs(bwrap: None, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    # the workspace's venv, made by the Python tether runs on (outside /usr here: pyenv, conda ...)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(ws / ".venv")], check=True)
    copy_pytest_into(ws / ".venv")
    (ws / "test_x.py").write_text("def test_x():\n    assert 1 + 1 == 2\n")
    (ws / "h.c").write_text("#include <stdio.h>\nint main(void){puts(\"c-ok\");return 0;}\n")
    (ws / "h.cc").write_text("#include <iostream>\nint main(){std::cout<<\"cxx-ok\"<<std::endl;}\n")
    (ws / "H.java").write_text('class H{public static void main(String[] a){System.out.println("java-ok");}}')
    (ws / "Makefile").write_text("all:\n\t@echo make-ok\n")
    for_commands(ws)
    bash = shell_tool(ws, timeout=HANG, sandbox=Bubblewrap(ws))
    out = await sh(bash, (
        "echo b a | tr ' ' '\\n' | sort | head -1; ls -l h.c | cut -c1; wc -l < h.c; "
        "date +%Y >/dev/null && echo date-ok; whoami; "
        "git init -q r && cd r && echo x > f && git add f && git -c user.name=t -c user.email=t@e "
        "commit -qm m "
        "&& git log --format=%s && cd ..; python3 -c 'import ssl, sqlite3, json; print(\"py-ok\")'; "
        "python3 -c 'import multiprocessing as m; print(m.Pool(2).map(abs, [-3]))'; "
        ".venv/bin/python -m pytest -q -p no:cacheprovider test_x.py 2>&1 | tail -1"))
    lines = out.splitlines()
    assert lines[:4] == ["a", "-", "2", "date-ok"], out
    assert "m" in lines and "py-ok" in lines and "[3]" in lines, out
    assert "1 passed" in out, out
    compilers = {"gcc": "gcc h.c -o hc && ./hc", "g++": "g++ h.cc -o hcc && ./hcc", "make": "make",
                 "javac": "javac H.java && java -cp . H", "node": "node -e 'console.log(\"node-ok\")'"}
    here = {name: cmd for name, cmd in compilers.items() if shutil.which(name, path="/usr/bin:/bin")}
    if here:
        out = await sh(bash, "; ".join(here.values()))
        for expected in {"gcc": "c-ok", "g++": "cxx-ok", "make": "make-ok", "javac": "java-ok",
                         "node": "node-ok"}.items():
            if expected[0] in here:
                assert expected[1] in out, out


async def test_named_paths_are_readable_read_only_and_hidden_ones_stay_hidden(planted: Planted,
                                                                              tmp_path: Path) -> None:
    tools = planted.root / "tools"
    (tools / "keys").mkdir(parents=True)
    (tools / "bin.sh").write_text("echo TOOL-RAN\n")
    (tools / "keys" / "k").write_text("KEY-INSIDE-TOOLS\n")
    link = planted.root / "current"
    link.symlink_to(tools)
    (planted.root / "hop").symlink_to(tools)
    latest = planted.root / "latest"  # through a link the sandbox does not have: straight to where it leads
    latest.symlink_to(planted.root / "hop")
    in_tmp = tmp_path / "shared"  # under /tmp, which the sandbox replaces with its own
    in_tmp.mkdir()
    (in_tmp / "data.txt").write_text("DATA-UNDER-TMP\n")
    for p in [tools, *tools.rglob("*"), in_tmp, *in_tmp.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    ws = planted.workspace
    box = Bubblewrap(ws, readable=[link, in_tmp, latest], hidden=[tools / "keys"])
    out = await sh(shell_tool(ws, timeout=HANG, sandbox=box), (
        f"bash {link}/bin.sh; bash {latest}/bin.sh; cat {in_tmp}/data.txt; cat {tools}/keys/k; "
        f"readlink {link}; touch {tools}/new 2>&1; cat {planted.root}/sibling/notes.txt 2>&1"))
    assert out.count("TOOL-RAN") == 2 and "DATA-UNDER-TMP" in out, out
    assert str(tools) in out  # the symlink named is a symlink there too
    assert "KEY-INSIDE-TOOLS" not in out and "SECRET-sibling" not in out, out
    assert "Read-only file system" in out and not (tools / "new").exists()


@pytest.mark.skipif(not ROOT, reason="without root every test here runs this path already")
def test_the_user_namespace_path_mounts_the_same_allowlist(planted: Planted,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """What a normal user gets (bwrap in a new user namespace): bwrap's options for a non-root tether,
    run by nobody."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is needed to run bwrap as a normal user")
    ws = planted.workspace
    monkeypatch.setattr("tether.tools._sandbox.os.geteuid", lambda: 65534)
    monkeypatch.setattr("tether.tools._sandbox.os.getuid", lambda: 65534)
    monkeypatch.setattr("tether.tools._sandbox.os.getgid", lambda: 65534)
    # tether's own Python prefix may be where nobody cannot look (/root/.pyenv): a normal user's is theirs
    box = Bubblewrap(ws, toolchain=TOOLCHAIN)
    command = (probe_reads(planted) + "; id -un; cat /proc/self/uid_map | wc -l; git --version | cut -c1-11; "
               "python3 -c 'print(7*6)'")
    launch = box.launch(["bash", "-c", command], cwd=ws, env={"PATH": "/usr/bin:/bin"})
    assert "--unshare-user" in launch.argv
    proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *launch.argv],
                          env=launch.env, capture_output=True, text=True, timeout=HANG, check=False)
    out = proc.stdout + proc.stderr
    if "No permissions to create new namespace" in out or "setting up uid map" in out:
        pytest.skip(f"unprivileged user namespaces are not available here: {out.strip()}")
    assert proc.returncode == 0, out
    for path, secret in planted.secrets.items():
        assert secret not in out, f"{path} was readable: {out}"
    assert sorted(out.split("LISTED\n", 1)[1].split("END", 1)[0].split()) == [".", "..", "ws"], out
    assert out.rstrip().splitlines()[-4:] == ["nobody", "1", "git version", "42"], out


def test_the_default_toolchain_is_usr_and_the_python_tether_runs_on(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "pyenv" / "3.12"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_toolchain() == (*TOOLCHAIN, str((tmp_path / "pyenv" / "3.12").resolve()))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path))  # a prefix holding the home directory: not that
    assert default_toolchain() == TOOLCHAIN
    assert "/usr" in TOOLCHAIN and not {"hosts", "resolv.conf", "ssl/certs"} & set(ETC_READABLE)
    assert {"hosts", "resolv.conf", "ssl/certs"} <= set(ETC_NETWORK)


def test_the_environment_names_more_readable_paths(bwrap: None, tmp_path: Path) -> None:
    box = default_sandbox(tmp_path, readable=["/a"], environ={READ_ENV: f"/b{os.pathsep}{os.pathsep}/c"})
    assert isinstance(box, Bubblewrap) and list(box.readable) == ["/a", "/b", "/c"]


def test_the_cli_option_and_variable_reach_the_sandbox(bwrap: None, tmp_path: Path) -> None:
    """`tether --sandbox-read PATH` and $TETHER_SANDBOX_READ: those paths are readable, no other."""
    ws = tmp_path / "ws"
    ws.mkdir()
    named = {}
    for name in ("flag", "env", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f.txt").write_text(f"CONTENT-OF-{name.upper()}\n")
        named[name] = tmp_path / name
    command = "; ".join(f"cat {p}/f.txt" for p in named.values())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_",
                                                                     "ANTHROPIC_"))}
    with FakeOpenAIServer() as server:
        server.push(chat_completion(None, [tool_call("Bash", {"command": command}, id="c1")]),
                    chat_completion("done"))
        env.update(PYTHONPATH=str(REPO / "src"), OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url,
                   **{READ_ENV: str(named["env"])})
        proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "look", "--yes", "--tools", "bash",
                               "--sandbox-read", str(named["flag"])], cwd=ws, env=env, capture_output=True,
                              text=True, timeout=HANG, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = "\n".join(m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "tool")
    assert "CONTENT-OF-FLAG" in seen and "CONTENT-OF-ENV" in seen, seen
    assert "CONTENT-OF-OTHER" not in seen, seen


def test_a_workspace_venv_whose_python_is_not_shown_is_told_to_the_user(bwrap: None, tmp_path: Path) -> None:
    """Told, never mounted on the workspace's word: a pyvenv.cfg is the workspace's to write."""
    ws, python = tmp_path / "ws", tmp_path / "python-9.9"
    (python / "bin").mkdir(parents=True)
    (ws / ".venv").mkdir(parents=True)
    (ws / ".venv" / "pyvenv.cfg").write_text(f"home = {python}/bin\nversion = 9.9.0\n")
    (ws / "ok-venv").mkdir()
    (ws / "ok-venv" / "pyvenv.cfg").write_text(f"home = {Path(sys.base_prefix) / 'bin'}\n")
    said: list[str] = []
    box = default_sandbox(ws, warn=said.append, environ={})
    assert isinstance(box, Bubblewrap)
    assert said == [f"tether: .venv in the workspace runs the Python in {python}, which Bash's sandbox "
                    f"does not show: give --sandbox-read {python} to use it there."]
    assert str(python) not in box.args()
    said.clear()
    default_sandbox(ws, warn=said.append, environ={READ_ENV: str(python)})
    assert said == []
