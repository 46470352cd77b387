"""One clear line and the right exit code where a command used to dump a library's output or leave a
person guessing: `tether serve` on a port in use, Ctrl-C on `tether run --durable`, a model spec
whose provider tether does not know. (A corrupt run store: tests/test_doctor.py.)"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang import HANG

ROOT = Path(__file__).resolve().parents[1]
PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "ANTHROPIC_", "TETHER_", "OTEL_")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    return {**env, "TETHER_HOME": str(home), "PYTHONPATH": str(ROOT / "src"), **extra}


def _tether(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=HANG)


def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("dbos")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _tether(["serve", "--agents", f"{ROOT / 'tests' / 'service_agents.py'}:AGENTS", "--port", str(port)],
                       _env(tmp_path), tmp_path)
    assert done.returncode == 1, done.stderr  # an error, not 3 (a budget stop)
    assert done.stderr == f"tether: cannot serve on 127.0.0.1:{port}: port {port} is in use by another process " \
                          "(stop it, or choose another --port)\n"


def test_ctrl_c_on_a_durable_run_says_how_to_resume_it(tmp_path: Path) -> None:
    """The run is stopped mid model call; the line says what it did and names `tether resume`, which
    then finishes it; `tether runs` shows the steps it made meanwhile."""
    pytest.importorskip("dbos")
    from fake_openai_server import FakeOpenAIServer, Reply, chat_completion, tool_call

    (tmp_path / "notes.txt").write_text("the code is 7\n")
    script = [chat_completion(None, [tool_call("Read", {"file_path": "notes.txt"})]),
              Reply(body=chat_completion("7"), delay=2 * HANG), chat_completion("7")]
    with FakeOpenAIServer(script) as server:
        env = _env(tmp_path / "home", OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=server.base_url)
        proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "run", "--durable", "The code?"], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + HANG  # only catches a hang: the second model call is sent
        while len(server.requests) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(server.requests) == 2, proc.communicate(timeout=HANG)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG)
        assert proc.returncode == 130, err
        run_id = re.search(r"^durable run (\w+) \(", err, re.M).group(1)  # type: ignore[union-attr]  # (a notice may come first)
        assert err.splitlines()[-1] == (
            f"tether: interrupted: durable run {run_id} stopped after 1 model calls and 1 tool calls; it is saved, not "
            f"cancelled: `tether resume {run_id}` continues it from there, `tether cancel {run_id}` ends it"), err
        listed = _tether(["runs"], env, tmp_path)
        assert f"{run_id}  running" in listed.stdout and "steps=1" in listed.stdout, listed.stdout
        resumed = _tether(["resume", run_id], env, tmp_path)
        assert resumed.returncode == 0 and resumed.stdout == "7\n", resumed.stderr


def test_an_unknown_provider_is_named_in_one_line(tmp_path: Path) -> None:
    done = _tether(["--model", "nosuch:thing", "-p", "hi"], _env(tmp_path), tmp_path)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("tether: model 'nosuch:thing': 'nosuch' is not a provider (openai, openrouter, anthropic, "
                           "local), so the whole of it was read as a model name for the default OpenAI-compatible "
                           "endpoint, and none is configured"), line
    assert len(line) < 400
