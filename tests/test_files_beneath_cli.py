"""The issue's reproduction through the real CLI: in one turn a sandboxed Bash swaps a workspace
directory with a symlink to a directory outside (renameat2 RENAME_EXCHANGE in a loop) while parallel
Writes and Reads run; none lands outside and no read returns outside contents. Scripted model over
HTTP, real bubblewrap, no --yes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from hang import HANG

from tether.tools._sandbox import probe_bubblewrap

BWRAP_PROBLEM = probe_bubblewrap()
SWAPPER = r"""python3 - <<'PY'
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
open("swapping", "w").close()
end = time.time() + 6
n = 0
while time.time() < end:
    libc.renameat2(-100, b"d", -100, b"e", 2)
    n += 1
print("swaps", n)
PY"""


@pytest.fixture(autouse=True)
def _needs_bwrap() -> None:
    if BWRAP_PROBLEM is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bubblewrap is required under CI=true: {BWRAP_PROBLEM}")
        pytest.skip(f"bubblewrap cannot run here ({BWRAP_PROBLEM})")


def test_a_swapping_bash_and_parallel_file_calls_in_one_turn(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f.txt").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("OUTSIDE-CONTENT\n")
    (ws / "e").symlink_to(outside, target_is_directory=True)
    calls = [tool_call("Bash", {"command": SWAPPER}, id="bash")]
    for i in range(700):
        calls.append(tool_call("Write", {"file_path": f"d/w{i}.txt", "content": f"x{i}"}, id=f"w{i}"))
        calls.append(tool_call("Read", {"file_path": "d/f.txt", "offset": 1, "limit": i + 1}, id=f"r{i}"))
    script = [chat_completion(None, calls), chat_completion("done")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_"))}
    with FakeOpenAIServer(script) as server:
        env.update(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=server.base_url)
        # --yes: every write after the Bash result (which taints) runs, so all 700 meet the swapping
        # link (without it they are denied, and the run stops at its approval budget after 5)
        proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "tidy up", "--workspace", str(ws),
                               "--max-seconds", "120", "--yes"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=HANG)
        bodies = [r.body for r in server.requests]
    assert proc.returncode == 0, proc.stderr
    results = {m.get("tool_call_id"): m.get("content", "") for m in bodies[1]["messages"] if m["role"] == "tool"}
    assert "swaps" in results["bash"], results["bash"]  # the swapping really ran
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"], "a write landed outside the workspace"
    assert (outside / "f.txt").read_text() == "OUTSIDE-CONTENT\n"
    assert "OUTSIDE-CONTENT" not in json.dumps(bodies[1])
    refused = [k for k, v in results.items() if "symbolic link" in v]
    done = [k for k, v in results.items() if k != "bash" and "symbolic link" not in v]
    print(f"{len(refused)} refused, {len(done)} done")  # both happen when the race overlaps the calls


def test_the_sandbox_through_the_cli_never_root_git_read_only_environment_by_allowlist(tmp_path: Path) -> None:
    """Items 3-5 of the issue through `tether -p`: a Bash call tries each attack; markers decide."""
    ws = tmp_path / "ws"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True, capture_output=True)
    attack = ("id -u > uid.txt; env > env.txt; cat /proc/1/environ >> env.txt; head -c 5 /etc/shadow > shadow.txt; "
              "cp /bin/sh sh; chmod 4755 sh; mv .git .git.orig; echo 'touch PWNED' > .git/hooks/pre-commit; "
              "git config core.fsmonitor 'touch PWNED'; echo finished")
    script = [chat_completion(None, [tool_call("Bash", {"command": attack}, id="bash")]), chat_completion("done")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_"))}
    env.update(GH_PAT="ghp_leak1", DB_PASS="leak2", MYSQL_PWD="leak3", REDIS_URL="redis://:leak4@cache:6379",
               SENTRY_DSN="https://leak5@o1.ingest.sentry.io/1", CI_JOB_JWT="eyJleak6", KEEP_ME="kept")
    with FakeOpenAIServer(script) as server:
        env.update(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=server.base_url)
        proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "check the build", "--workspace", str(ws),
                               "--env", "KEEP_ME", "--apply"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert (ws / "uid.txt").read_text().strip() != "0"
    assert (ws / "shadow.txt").read_text() == ""
    planted = ws / "sh"
    assert not (planted.exists() and planted.stat().st_uid == 0 and planted.stat().st_mode & 0o4000)
    assert (ws / ".git" / "HEAD").is_file() and not (ws / ".git.orig").exists()
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (ws / ".git" / "config").read_text()
    seen = (ws / "env.txt").read_text()
    assert "KEEP_ME=kept" in seen and "sk-test" not in seen
    for i in range(1, 7):
        assert f"leak{i}" not in seen
