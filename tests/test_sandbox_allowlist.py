"""The bubblewrap sandbox by allowlist: commands run unprivileged (never as root, no capabilities,
nosuid/nodev), the whole .git stays read-only (submodules included), and the environment holds only
what is allowed or named. Real bubblewrap; skipped without it, failed under CI=true."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from hang import HANG

from tether.tools._base import Tool
from tether.tools._sandbox import ENV_ALLOWLIST, Bubblewrap, probe_bubblewrap, sandbox_environ
from tether.tools.builtin import shell_tool

BWRAP_PROBLEM = probe_bubblewrap()


@pytest.fixture(autouse=True)
def _needs_bwrap() -> None:
    if BWRAP_PROBLEM is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bubblewrap is required under CI=true: {BWRAP_PROBLEM}")
        pytest.skip(f"bubblewrap cannot run here ({BWRAP_PROBLEM})")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    if os.geteuid() == 0:  # a normal user's workspace (a root-owned one is read-only to commands: see below)
        os.chown(root, 65534, 65534)
    return root


async def sh(tool: Tool, command: str) -> str:
    return await tool.fn(**tool.validator.validate({"command": command}))


# --- item 3: never root, no capabilities, nosuid/nodev --------------------------------------------


async def test_commands_run_unprivileged_and_cannot_plant_a_setuid_root_binary(ws: Path) -> None:
    bash = shell_tool(ws, timeout=HANG, sandbox=Bubblewrap(ws))
    out = await sh(bash, "id -u; head -c 5 /etc/shadow || echo NO-SHADOW; grep -E '^(CapEff|CapBnd|NoNewPrivs)' "
                         "/proc/self/status; cp /bin/sh ./sh && chmod 4755 ./sh; "
                         f"grep ' {ws} ' /proc/self/mountinfo")
    lines = out.splitlines()
    assert lines[0] != "0", out
    assert "NO-SHADOW" in out and "root:" not in out
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    mount = next(line for line in lines if f" {ws} " in line)
    assert "nosuid" in mount and "nodev" in mount
    planted = os.stat(ws / "sh")
    assert planted.st_uid != 0, "a setuid binary owned by root was left in the workspace"
    assert not (planted.st_mode & stat.S_ISUID and planted.st_uid == 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="what a root-owned workspace gives only shows when tether runs as root")
async def test_as_root_a_root_owned_workspace_is_written_as_nobody_and_never_gets_a_setuid_file(
        tmp_path: Path) -> None:
    """Commands run as nobody; an id-mapped view lets them write root's workspace (files stay root's
    on disk) and a seccomp filter refuses every way of making a file setuid or setgid there."""
    root_ws = tmp_path / "rootws"
    root_ws.mkdir()
    root_ws.chmod(0o755)
    (root_ws / "f.txt").write_text("readable\n")
    before = _tether_mounts()  # a process killed mid-command elsewhere may have left one: not this test's
    box = Bubblewrap(root_ws)
    out = await sh(shell_tool(root_ws, timeout=HANG, sandbox=box), (
        "id -u; cat f.txt; echo more >> f.txt; echo new > g.txt; head -c 5 /etc/shadow || echo NO-SHADOW; "
        "cp /bin/sh sh; chmod 4755 sh; chmod g+s g.txt; install -m 4755 /bin/sh sh2; "
        "python3 -c \"import os; os.open('sh3', os.O_CREAT | os.O_WRONLY, 0o4755)\"; mkdir -m 2755 d; "
        "python3 -c \"import os; os.chmod('sh', 0o2755)\"; echo done"))
    assert out.splitlines()[:2] == ["65534", "readable"], out
    assert "NO-SHADOW" in out and out.rstrip().endswith("done")
    assert (root_ws / "f.txt").read_text() == "readable\nmore\n" and (root_ws / "g.txt").read_text() == "new\n"
    assert os.stat(root_ws / "g.txt").st_uid == 0  # root's on disk, as the user's other files
    for path in root_ws.rglob("*"):
        assert not os.stat(path).st_mode & (stat.S_ISUID | stat.S_ISGID), f"{path.name} is setuid/setgid: {out}"
    assert _tether_mounts() == before  # the id-mapped view is gone with the command


def _tether_mounts() -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "tether-ws-" in line]


# --- item 4: the whole .git, submodules included, and user-named paths ----------------------------


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"})


@pytest.fixture
def repo(ws: Path) -> Path:
    _git("init", "-q", cwd=ws)
    (ws / ".git" / "modules" / "lib" / "hooks").mkdir(parents=True)
    (ws / ".git" / "modules" / "lib" / "config").write_text("[core]\n")
    (ws / "lib").mkdir()
    (ws / "lib" / ".git").write_text("gitdir: ../.git/modules/lib\n")
    (ws / "vendor").mkdir()  # a submodule not checked out yet
    (ws / ".gitmodules").write_text('[submodule "lib"]\n\tpath = lib\n[submodule "v"]\n\tpath = vendor\n')
    (ws / ".envrc").write_text("export A=1\n")
    if os.geteuid() == 0:
        for path in [ws, *ws.rglob("*")]:
            os.lchown(path, 65534, 65534)
    return ws


async def test_the_whole_git_directory_is_read_only_and_cannot_be_moved(repo: Path) -> None:
    bash = shell_tool(repo, timeout=HANG, sandbox=Bubblewrap(repo, executed_later=[".envrc"]))
    attacks = {
        "mv": "mv .git .git.orig && cp -a .git.orig .git",
        "rm": "rm -rf .git",
        "hook": "echo 'touch PWNED' > .git/hooks/pre-commit",
        "fsmonitor": "git config core.fsmonitor 'touch PWNED'",
        "module-hook": "echo 'touch PWNED' > .git/modules/lib/hooks/post-checkout",
        "module-config": "echo '[core] fsmonitor = touch PWNED' >> .git/modules/lib/config",
        "gitlink": "echo 'gitdir: ../evil' > lib/.git",
        "gitlink-rm": "rm lib/.git && echo 'gitdir: ../evil' > lib/.git",
        "unborn-submodule": "echo 'gitdir: ../evil' > vendor/.git",
        "user-named": "echo 'touch PWNED' >> .envrc",
    }
    for name, attack in attacks.items():
        out = await sh(bash, attack + " && echo ATTACK-SUCCEEDED")
        assert "ATTACK-SUCCEEDED" not in out, f"{name}: {out}"
    assert (repo / ".git" / "HEAD").is_file() and not (repo / ".git.orig").exists()
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (repo / ".git" / "config").read_text()
    assert not (repo / ".git" / "modules" / "lib" / "hooks" / "post-checkout").exists()
    assert (repo / "lib" / ".git").read_text() == "gitdir: ../.git/modules/lib\n"
    assert not (repo / "vendor" / ".git").exists()
    assert (repo / ".envrc").read_text() == "export A=1\n"
    # the rest of the workspace stays writable
    assert await sh(bash, "echo ok > work.txt && cat work.txt") == "ok\n"


# --- item 5: the environment by allowlist ---------------------------------------------------------

LEAKY = {
    "GH_PAT": "ghp_leak1", "DB_PASS": "leak2", "MYSQL_PWD": "leak3", "REDIS_URL": "redis://:leak4@cache:6379",
    "SENTRY_DSN": "https://leak5@o1.ingest.sentry.io/1", "CI_JOB_JWT": "eyJleak6", "SOMETHING_NEW": "leak7",
}


async def test_no_variable_reaches_a_command_unless_allowed_or_named(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LEAKY.items():
        monkeypatch.setenv(name, value)
    bash = shell_tool(ws, timeout=HANG, sandbox=Bubblewrap(ws), pass_env=["SOMETHING_NEW"])
    out = await sh(bash, "env; cat /proc/1/environ /proc/$PPID/environ | tr '\\0' '\\n'")
    for i in range(1, 7):
        assert f"leak{i}" not in out, out
    assert "SOMETHING_NEW=leak7" in out  # named with --env
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    allowed = {*ENV_ALLOWLIST, "SOMETHING_NEW", "HOME", "TMPDIR", "PWD", "SHLVL", "OLDPWD", "_", "USER", "LOGNAME"}
    assert names <= allowed, names - allowed


def test_sandbox_environ_is_an_allowlist() -> None:
    env = sandbox_environ(["EXTRA"], {"PATH": "/bin", "LANG": "C", "GH_PAT": "x", "EXTRA": "y", "HOME": "/root"})
    assert env == {"PATH": "/bin", "LANG": "C", "EXTRA": "y"}
