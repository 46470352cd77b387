"""The `tether` command end to end: real processes against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_completion, tool_call
from hang import HANG

from tether._types import RunResult, StopReason, from_json

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "your_program.sh"
PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "TETHER_", "ANTHROPIC_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    env.update(extra)
    return env


def tether(args: list[str], *, cwd: Path, env: dict[str, str], stdin: str | None = None,
           timeout: float = HANG) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def openrouter_env(server: FakeOpenAIServer) -> dict[str, str]:
    return clean_env(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=server.base_url)


def test_print_mode_prints_only_the_answer(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the launch code is 7431\n")
    script = [chat_completion(None, [tool_call("Read", {"file_path": "notes.txt"})]), chat_completion("7431")]
    with FakeOpenAIServer(script) as server:
        proc = tether(["-p", "What is the launch code? Number only."], cwd=tmp_path, env=openrouter_env(server))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "7431\n"
    assert proc.stderr == ""  # not a terminal and no -v: quiet
    first, second = (r.body for r in server.requests)
    assert first["model"] == "anthropic/claude-haiku-4.5"
    assert {t["function"]["name"] for t in first["tools"]} >= {"Read", "Write", "Edit", "Glob", "Grep", "Bash"}
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"
    tool_msg, note = second["messages"][-2:]  # the tool's text as returned, then the policy's label
    assert tool_msg["role"] == "tool" and tool_msg["content"] == "the launch code is 7431\n"
    assert note["role"] == "user" and "not instructions" in note["content"]


def test_prompt_from_stdin_and_run_subcommand(tmp_path: Path) -> None:
    with FakeOpenAIServer([chat_completion("one"), chat_completion("two")]) as server:
        env = openrouter_env(server)
        piped = tether(["-p", "-", "--tools", "none"], cwd=tmp_path, env=env, stdin="question from a pipe\n")
        sub = tether(["run", "a question", "--model", "my/model", "--tools", "calculator"], cwd=tmp_path, env=env)
    assert (piped.returncode, piped.stdout) == (0, "one\n")
    assert (sub.returncode, sub.stdout) == (0, "two\n")
    first, second = (r.body for r in server.requests)
    assert first["messages"][-1]["content"] == "question from a pipe"
    assert "tools" not in first
    assert second["model"] == "my/model"
    assert [t["function"]["name"] for t in second["tools"]] == ["calculator"]  # read_result once capped


def _endless_tools(request: RecordedRequest) -> dict:
    """Calls a tool whenever it may; the final call (tool choice "none") gets a partial answer."""
    if request.body.get("tools") and request.body.get("tool_choice") != "none":
        n = len(request.body["messages"])
        return chat_completion(None, [tool_call("calculator", {"expression": f"{n} * 2"}, id=f"c{n}")])
    return chat_completion("partial: doubled a few numbers")


def test_budget_stop_exits_3_with_one_stderr_line(tmp_path: Path) -> None:
    with FakeOpenAIServer(responder=_endless_tools) as server:
        proc = tether(["-p", "keep going", "--tools", "calculator", "--max-steps", "3"], cwd=tmp_path,
                      env=openrouter_env(server))
    assert proc.returncode == 3
    assert proc.stdout == "partial: doubled a few numbers\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tether: stopped at the step limit (max_steps) after 3 steps and 2 tool calls")
    assert lines[0].endswith("partial answer on stdout, 2 findings")  # the 3rd call is never run
    assert len(server.requests) == 4  # 3 steps + the reserved tool-free call
    assert server.requests[-1].body["tool_choice"] == "none" and server.requests[-1].body["tools"]


def test_model_error_exits_1_with_one_line(tmp_path: Path) -> None:
    with FakeOpenAIServer([Reply.error(400, "model not allowed")]) as server:
        proc = tether(["-p", "hi"], cwd=tmp_path, env=openrouter_env(server))
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tether: error after 0 steps")
    assert "model not allowed" in lines[0] and lines[0].endswith("no answer, 0 findings")


def test_json_output_is_a_run_result(tmp_path: Path) -> None:
    script = [chat_completion(None, [tool_call("calculator", {"expression": "6 * 7"})]), chat_completion("42")]
    with FakeOpenAIServer(script) as server:
        proc = tether(["-p", "6 times 7?", "--json", "--tools", "calculator"], cwd=tmp_path,
                      env=openrouter_env(server))
    assert proc.returncode == 0, proc.stderr
    result = from_json(RunResult, proc.stdout)
    assert result.stop_reason is StopReason.COMPLETED
    assert result.answer == "42"
    assert result.steps == 2 and result.usage.tool_calls == 1
    assert result.usage.input_tokens == 22  # 11 per scripted completion
    assert [m.role for m in result.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert result.messages[3].content == "42"  # the calculator's result
    assert [e.kind for e in result.trace] == ["run_started", "model_call_started", "model_call", "tool_call_started",
                                              "tool_call", "model_call_started", "model_call", "stop"]


def test_trace_file_has_one_line_per_event(tmp_path: Path) -> None:
    import json

    script = [chat_completion(None, [tool_call("calculator", {"expression": "2 + 2"})]), chat_completion("4")]
    trace = tmp_path / "out" / "trace.jsonl"
    trace.parent.mkdir()
    with FakeOpenAIServer(script) as server:
        proc = tether(["-p", "2+2", "--json", "--trace", str(trace), "--tools", "calculator"], cwd=tmp_path,
                      env=openrouter_env(server))
    assert proc.returncode == 0, proc.stderr
    result = from_json(RunResult, proc.stdout)
    lines = trace.read_text().splitlines()
    assert len(lines) == len(result.trace) == 8
    records = [json.loads(line) for line in lines]
    assert [r["kind"] for r in records] == [e.kind for e in result.trace]
    assert {r["run_id"] for r in records} == {result.run_id}
    tool_record = records[4]
    assert tool_record["data"]["name"] == "calculator"
    assert tool_record["data"]["arguments"] == {"expression": "2 + 2"}
    assert set(records[2]) == {"time", "run_id", "kind", "step", "t", "duration", "data"}
    assert records[2]["data"]["input_tokens"] == 11


def test_chat_keeps_context_across_turns(tmp_path: Path) -> None:
    script = [chat_completion("Nice to meet you, Ada."), chat_completion("Your name is Ada.")]
    with FakeOpenAIServer(script) as server:
        proc = tether(["chat", "--tools", "none"], cwd=tmp_path, env=openrouter_env(server),
                      stdin="My name is Ada.\n\nWhat is my name?\n/exit\nnever sent\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Nice to meet you, Ada.\nYour name is Ada.\n"
    assert len(server.requests) == 2
    second = server.requests[1].body["messages"]
    assert [(m["role"], m["content"]) for m in second[1:]] == [
        ("user", "My name is Ada."),
        ("assistant", "Nice to meet you, Ada."),
        ("user", "What is my name?"),
    ]
    assert sum(m["role"] == "system" for m in second) == 1


def test_chat_reset_forgets(tmp_path: Path) -> None:
    with FakeOpenAIServer([chat_completion("a"), chat_completion("b")]) as server:
        proc = tether(["chat", "--tools", "none"], cwd=tmp_path, env=openrouter_env(server),
                      stdin="first\n/reset\nsecond\n")
    assert proc.returncode == 0 and proc.stdout == "a\nb\n"
    assert [m["content"] for m in server.requests[1].body["messages"][1:]] == ["second"]


def test_ctrl_c_cancels_and_reports(tmp_path: Path) -> None:
    # the reply would come after the test's hang bound: the run ends because it was cancelled, or not at all
    with FakeOpenAIServer([Reply(body=chat_completion("too late"), delay=2 * HANG)]) as server:
        proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "-p", "slow one"], cwd=tmp_path,
                                env=openrouter_env(server), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + HANG
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.requests, "the model was never called"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 130, err
    assert out == ""
    assert err.splitlines()[-1].startswith("tether: cancelled (interrupted by Ctrl-C) after 0 steps")


def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    env = clean_env(OPENROUTER_API_KEY="k", OPENROUTER_BASE_URL="http://127.0.0.1:9/v1")
    unknown = tether(["-p", "x", "--tools", "coding,web"], cwd=tmp_path, env=env)
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == ("tether: unknown tool set 'web' in --tools; choose from: coding, calculator, "
                                      "files, bash, none")
    empty = tether(["-p", "   "], cwd=tmp_path, env=env)
    assert (empty.returncode, empty.stderr.strip()) == (1, "tether: the prompt is empty")
    usage = tether(["-p", "x", "--max-steps", "0"], cwd=tmp_path, env=env)
    assert usage.returncode == 2  # click's usage error, distinct from a budget stop


def test_models_lists_endpoints_without_keys(tmp_path: Path) -> None:
    env = clean_env(OPENROUTER_API_KEY="sk-very-secret", TETHER_MODELS_DIR=str(tmp_path))
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    proc = subprocess.run([sys.executable, "-m", "tether", "models"], env=env, capture_output=True, text=True,
                          timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert "sk-very-secret" not in proc.stdout
    assert "anthropic/claude-haiku-4.5" in proc.stdout
    assert "tiny.gguf" in proc.stdout
    assert "default (no --model): anthropic/claude-haiku-4.5 at https://openrouter.ai/api/v1" in proc.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell script")
def test_your_program_sh_as_the_course_calls_it(tmp_path: Path) -> None:
    """The CodeCrafters tester: absolute path, its own working directory, OPENROUTER_* set, exact stdout."""
    (tmp_path / "README.md").write_text("Project notes.")
    (tmp_path / "README_old.md").write_text("Old notes.")
    script = [
        chat_completion(None, [tool_call("Read", {"file_path": "README.md"}, id="c1")]),
        chat_completion(None, [tool_call("Write", {"file_path": "app/out.txt", "content": "hello"}, id="c2"),
                               tool_call("Bash", {"command": "rm README_old.md"}, id="c3")]),
        chat_completion("Deleted README_old.md"),
    ]
    with FakeOpenAIServer(script) as server:
        env = openrouter_env(server)
        env["PATH"] = os.environ["PATH"]
        proc = subprocess.run([str(PROGRAM), "-p", "Delete the old readme file."], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip() == "Deleted README_old.md"
    assert not (tmp_path / "README_old.md").exists()
    assert (tmp_path / "app" / "out.txt").read_text() == "hello"
    bodies = [r.body for r in server.requests]
    assert all(b["model"] == "anthropic/claude-haiku-4.5" for b in bodies)
    assert server.requests[0].path == "/v1/chat/completions"
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in bodies[0]["tools"]}
    assert tools["Read"]["required"] == ["file_path"]
    assert set(tools["Write"]["required"]) == {"file_path", "content"}
    assert tools["Bash"]["required"] == ["command"]
    # The file's text reaches the model exactly as read, labelled as data in a note after it.
    read_back, note = bodies[1]["messages"][-2:]
    assert read_back["role"] == "tool" and read_back["content"] == "Project notes."
    assert note["role"] == "user" and "Read" in note["content"] and "not instructions" in note["content"]


def test_ctrl_c_in_chat_cancels_the_turn_and_keeps_the_conversation(tmp_path: Path) -> None:
    script = [Reply(body=chat_completion("too late"), delay=2 * HANG), chat_completion("second answer")]
    lines = tmp_path / "stdin.txt"
    lines.write_text("a slow question\nanother question\n")
    with FakeOpenAIServer(script) as server, lines.open() as stdin:
        proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "chat", "--tools", "none"], cwd=tmp_path,
                                env=openrouter_env(server), stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + HANG
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, err
    assert out == "second answer\n"
    assert "tether: cancelled (interrupted by Ctrl-C)" in err
    second = server.requests[1].body["messages"]
    assert [(m["role"], m["content"]) for m in second[1:]] == [
        ("user", "a slow question"), ("user", "another question")]


def test_compact_folds_old_turns_into_a_recorded_summary(tmp_path: Path) -> None:
    """`--compact`: past 60% of the window (32,768 tokens for an unknown model) the old turns are
    folded by a summary call of the same model, and later requests are smaller for it."""
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]
    for i in range(30):
        (tmp_path / f"log{i}.txt").write_text("\n".join(f"{i} {w} {j} " + " ".join(words[(i + j) % 12:]) * 4
                                                        for j, w in enumerate(words * 6)))

    asked: list[int] = []  # the reads the model asked for (the transcript forgets folded ones)

    def responder(request: RecordedRequest) -> dict:
        body = request.body
        if "compact an agent's working transcript" in str(body["messages"][0].get("content")):
            return chat_completion("Summary: read log files 0 onwards; nothing alarming found.")
        if len(asked) < 30 and body.get("tool_choice") != "none":
            asked.append(len(asked))
            return chat_completion(None, [tool_call("Read", {"file_path": f"log{asked[-1]}.txt"}, id=f"r{asked[-1]}")])
        return chat_completion("All 30 logs read: nothing alarming.")

    with FakeOpenAIServer(responder=responder) as server:
        proc = tether(["-p", "Read log0.txt to log29.txt one by one, then summarise.", "--compact", "--tools", "files", "--model", "fake-model",
                       "--max-steps", "40", "--json"], cwd=tmp_path, env=openrouter_env(server))
    assert proc.returncode == 0, proc.stderr
    result = from_json(RunResult, proc.stdout)
    assert result.stop_reason is StopReason.COMPLETED and result.answer == "All 30 logs read: nothing alarming."
    bodies = [r.body for r in server.requests]
    summaries = [b for b in bodies if "compact an agent's working transcript" in str(b["messages"][0].get("content"))]
    assert summaries, "no summary call was made"
    agent_calls = [b for b in bodies if b not in summaries]
    assert len(json.dumps(agent_calls[-1]["messages"])) < len(json.dumps(agent_calls[len(agent_calls) // 2]["messages"])) * 2
    assert any("Context compacted" in json.dumps(b["messages"]) for b in agent_calls)
    assert {"update_plan", "set_step"} <= {t["function"]["name"] for t in agent_calls[0]["tools"]}
