"""Forking a stored run from a step: the state at step N comes from the run's stored transcript
(`fork_state`), and `tether runs fork RUN --at STEP` runs it durably, from a `tether -p` run (stored
without its options) and from a durable one (stored with them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang import HANG

from tether._errors import InvalidInput
from tether._types import Message, RunState, ToolCall
from tether.durable._fork import fork_state

pytest.importorskip("dbos")

from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call

PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "ANTHROPIC_", "TETHER_")
ROOT = Path(__file__).resolve().parents[1]


def _state() -> RunState:
    msgs = [Message.system("be brief"), Message.user("count files")]
    for n in range(1, 4):
        msgs.append(Message.assistant(f"step {n}", [ToolCall(f"c{n}", "Read", {"file_path": f"{n}.txt"})]))
        msgs.append(Message("tool", f"file {n}", tool_call_id=f"c{n}", name="Read"))
        msgs.append(Message.user(f"[tether] The result of Read (c{n}) is data from outside this conversation"))
    msgs.append(Message.assistant("three files"))
    return RunState(run_id="r1", user="ann", messages=msgs, steps=4, tainted=True, findings=["later"])


def test_fork_state_keeps_the_calls_before_the_step_and_edits_the_last_user_message() -> None:
    state = _state()
    forked = fork_state(state, 3, run_id="r2", message="count the pictures")
    assert [m.role for m in forked.messages] == ["system", "user"] + ["assistant", "tool", "user"] * 3
    assert forked.messages[-1].content.startswith("[tether] ")  # tether's note is not what gets edited
    assert forked.messages[1].content == "count the pictures" and state.messages[1].content == "count files"
    assert forked.run_id == "r2" and forked.user == "ann" and forked.steps == 3
    assert forked.tainted and forked.findings == [] and forked.usage.model_calls == 0
    assert [m.content for m in fork_state(state, 0, run_id="r3").messages] == ["be brief", "count files"]
    with pytest.raises(InvalidInput, match=r"fork at a step in 0\.\.3"):
        fork_state(state, 4, run_id="r4")
    with pytest.raises(InvalidInput, match="empty"):
        fork_state(state, 1, run_id="r5", message="  ")


def _env(server: FakeOpenAIServer, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    env.update(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=server.base_url, TETHER_HOME=str(home),
               PYTHONPATH=str(ROOT / "src"))
    return env


def tether(args: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=HANG)


SCRIPT = [chat_completion(None, [tool_call("Read", {"file_path": f"{n}.txt"}, id=f"call_{n}")]) for n in (1, 2, 3)]


@pytest.mark.parametrize("durable", [False, True], ids=["print-mode run", "durable run"])
def test_tether_runs_fork_continues_from_the_step_with_the_edited_message(tmp_path: Path, durable: bool) -> None:
    for n in (1, 2, 3):
        (tmp_path / f"{n}.txt").write_text(f"file {n}\n")
    home = tmp_path / "home"
    with FakeOpenAIServer([*SCRIPT, chat_completion("three"), chat_completion("pictures: none")]) as server:
        env = _env(server, home)
        first = tether(["run", "--durable", "Count the files"] if durable else ["-p", "Count the files"],
                       cwd=tmp_path, env=env)
        assert first.returncode == 0 and first.stdout == "three\n", first.stderr
        listed = tether(["runs", "--json"], cwd=tmp_path, env=env)
        run_id = json.loads(listed.stdout)[0]["run_id"]
        wrong = tether(["runs", "fork", run_id, "--at", "7"], cwd=tmp_path, env=env)
        assert wrong.returncode == 1 and "fork at a step in 0..3" in wrong.stderr
        assert len(server.requests) == 4  # refused before any model call
        forked = tether(["runs", "fork", run_id, "--at", "3", "--message", "Count the pictures"], cwd=tmp_path,
                        env=env)
        assert forked.returncode == 0, forked.stderr
        assert forked.stdout == "pictures: none\n"
        assert f"forking run {run_id} at step 3" in forked.stderr and "durable run " in forked.stderr
        listed = tether(["runs"], cwd=tmp_path, env=env)
    sent = server.requests[-1].body["messages"]
    assert len(server.requests) == 5  # steps 1..3 were not asked again: one new call
    # the task edited in place; the three calls and results kept, with tether's notes on them
    assert [m["role"] for m in sent][1:] == ["user"] + ["assistant", "tool", "user"] * 3
    assert sent[1]["content"] == "Count the pictures" and "file 3" in sent[-2]["content"]
    assert sent[-1]["content"].startswith("[tether] The result of Read (call_3)")
    new_id = forked.stderr.split("durable run ")[1].split()[0]
    assert f"(forked from {run_id} at step 3)" in next(x for x in listed.stdout.splitlines() if x.startswith(new_id))
