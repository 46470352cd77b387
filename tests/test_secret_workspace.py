"""Issue 44 item 3: the workspace's secret-bearing files are known by value from the run's start
(`SafetyPolicy(workspace=...)`): an output holding one of their values, or an exact encoding of one,
is a read of that file whatever the command's text, and the answer filter redacts the values."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import need_bubblewrap
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from test_cli import openrouter_env, tether  # the course tests' harness: a real process, a fake model server

from tether import Agent
from tether._limits import Limits
from tether.models._scripted import ScriptedModel, call
from tether.policy import CallbackApprover, SafetyPolicy
from tether.policy._workspace import SecretMatcher, secret_files_in, workspace_secrets
from tether.tools._sandbox import Unconfined
from tether.tools.builtin._shell import shell_tool
from tether.values import HANDLE

DB_PASS = "Wq8vL2nZ-r4Tx"  # matches no secret pattern: known by value only
TOKEN = "c4f1e9a07b3d5e28"
DOTENV = f"DEBUG=1\nPORT=8080\nDB_HOST=localhost\nDB_PASS={DB_PASS}\nTOKEN={TOKEN}\n"
YES = CallbackApprover(lambda request: True)  # unconfined Bash asks before every call


def _workspace(tmp_path: Path) -> Path:
    (tmp_path / ".env").write_text(DOTENV)
    (tmp_path / "notes.txt").write_text("plain notes\n")
    return tmp_path


def _run(root: Path, calls: list[Any], answer: str, *, workspace: bool = True) -> tuple[ScriptedModel, str]:
    model = ScriptedModel([*calls, answer])
    policy = SafetyPolicy(approver=YES, environment={}, workspace=root if workspace else None)
    result = Agent(model, tools=[shell_tool(root, sandbox=Unconfined())], policy=policy,
                   limits=Limits(max_steps=len(calls) + 2)).run("what is configured here?")
    return model, result.answer


def _tool_texts(model: ScriptedModel) -> list[str]:
    return [m.content for m in model.requests[-1].messages if m.role == "tool"]


BYPASSES = [
    [call("Bash", command="cat $(printf '\\x2eenv')")],
    [call("Bash", command="f=.e; cat ${f}nv")],
    [call("Bash", command="cp .env x"), call("Bash", command="cat x")],
    [call("Bash", command="tar c . | base64")],
    [call("Bash", command="find . -type f -exec cat {} +")],
    [call("Bash", command="""python3 -c "print(open('.e'+'nv').read())" """)],
    [call("Bash", command="mkdir -p config && mv .env config/ && cat config/*")],
    [call("Bash", command="cat $(printf '\\x2eenv'); exit 3")],  # an error output holds them too
]


@pytest.mark.parametrize("calls", BYPASSES, ids=lambda cs: cs[-1].arguments["command"])
def test_a_read_the_command_text_does_not_show_is_a_secret_handle(tmp_path: Path, calls: list[Any]) -> None:
    model, answer = _run(_workspace(tmp_path), calls, f"DB_PASS is {DB_PASS}.")
    shown = _tool_texts(model)[-1]
    assert HANDLE.search(shown) and "secret" in shown, shown
    seen = "\n".join(m.content for r in model.requests for m in r.messages)
    assert DB_PASS not in seen and TOKEN not in seen, seen
    assert re.fullmatch(r"DB_PASS is \[secret from \.env redacted\]\.", answer), answer


def test_without_a_workspace_the_same_read_is_shown(tmp_path: Path) -> None:
    model, _ = _run(_workspace(tmp_path), [call("Bash", command="cat $(printf '\\x2eenv')")], "ok", workspace=False)
    assert _tool_texts(model) == [DOTENV]


@pytest.mark.parametrize("command", ["echo DEBUG=1 PORT=8080 localhost", "cat notes.txt", "seq 8075 8085"])
def test_short_values_and_settings_do_not_make_outputs_secret(tmp_path: Path, command: str) -> None:
    model, answer = _run(_workspace(tmp_path), [call("Bash", command=command)], "PORT is 8080 on localhost.")
    (shown,) = _tool_texts(model)
    assert not HANDLE.search(shown), shown
    assert answer == "PORT is 8080 on localhost."


def test_a_workspace_with_no_secret_files_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text(f"plain notes {DB_PASS}\n")
    (tmp_path / ".env.example").write_text(f"DB_PASS={DB_PASS}\n")  # a template: placeholders, no secret
    policy = SafetyPolicy(approver=YES, environment={}, workspace=tmp_path)
    policy.start_run("r", None)
    assert policy._workspace_secrets is None and policy.secrets_of(None) == {}
    model, answer = _run(tmp_path, [call("Bash", command="cat notes.txt")], f"It says {DB_PASS}.")
    assert _tool_texts(model) == [f"plain notes {DB_PASS}\n"] and answer == f"It says {DB_PASS}."


def test_the_scan_is_bounded_and_stays_inside_the_workspace(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ".env").write_text("OUT=OutsideSecret99\n")
    root = tmp_path / "ws"
    (root / "config").mkdir(parents=True)
    (root / "config" / "prod.env").write_text(f"KEY={TOKEN}\n")
    (root / "node_modules" / "x").mkdir(parents=True)
    (root / "node_modules" / "x" / ".env").write_text("NM=NodeModSecret99\n")
    (root / "linked.env").symlink_to(outside / ".env")
    assert [p.relative_to(root.resolve()).as_posix() for p in secret_files_in(root)] == ["config/prod.env"]
    assert workspace_secrets(root) == {TOKEN: "config/prod.env"}


def test_the_matcher_finds_a_value_and_its_encodings_once_per_output() -> None:
    import base64

    matcher = SecretMatcher({DB_PASS: ".env"})
    assert matcher.source_in(f"x {DB_PASS} y") == ".env"
    assert matcher.source_in(base64.b64encode(f"A={DB_PASS}\n".encode()).decode()) == ".env"
    assert matcher.source_in(DB_PASS.encode().hex().upper()) == ".env"
    assert matcher.source_in("nothing here " * 100) is None


def test_the_cli_knows_the_workspace_secret_files_from_the_start(tmp_path: Path) -> None:
    need_bubblewrap()  # the CLI's Bash runs in the sandbox
    _workspace(tmp_path)
    script = [chat_completion(None, [tool_call("Bash", {"command": "cat $(printf '\\x2eenv')"})]),
              chat_completion(f"DB_PASS is {DB_PASS}.")]
    with FakeOpenAIServer(script) as server:
        proc = tether(["--yes", "-p", "what is configured here?"], cwd=tmp_path, env=openrouter_env(server))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "DB_PASS is [secret from .env redacted].\n"
    tool_msg = next(m for m in server.requests[1].body["messages"] if m["role"] == "tool")
    assert HANDLE.search(tool_msg["content"]) and DB_PASS not in tool_msg["content"], tool_msg


def test_a_resumed_run_knows_the_workspace_secret_files(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    first = SafetyPolicy(environment={}, workspace=root)
    data = first.dump_state(first.start_run("r", None))
    again = SafetyPolicy(environment={}, workspace=root)
    state = again.load_state(data)
    assert again.secrets_of(state) == {DB_PASS: ".env", TOKEN: ".env"}
