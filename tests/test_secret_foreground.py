"""Issue 44 item 3: a foreground Bash command or Read that reads a secret-bearing source (`.env`, a key
file, the environment) has its output kept behind a secret handle, as a background job's is once
delivered; its values are redacted from the answer; a command reading none is shown as before."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tether import Agent
from tether._limits import Limits
from tether.models._scripted import ScriptedModel, call
from tether.policy import CallbackApprover, SafetyPolicy
from tether.policy._sources import ENVIRONMENT, may_read_secrets, secret_sources_named
from tether.tools._sandbox import Unconfined
from tether.tools.builtin import file_tools
from tether.tools.builtin._shell import shell_tool
from tether.values import HANDLE

DB_PASS = "Wq8vL2nZ-r4Tx"  # a name that matches no secret pattern
TOKEN = "c4f1e9a07b3d5e28"
DOTENV = f"DB_HOST=localhost\nDB_PASS={DB_PASS}\nTOKEN={TOKEN}\n"
PLACEHOLDER = "[secret from .env redacted]"
YES = CallbackApprover(lambda request: True)  # unconfined Bash asks before every call


def _tools(tmp_path: Path) -> list[Any]:
    (tmp_path / ".env").write_text(DOTENV)
    (tmp_path / "notes.txt").write_text(f"plain notes {DB_PASS}\n")
    (tmp_path / "settings.yaml").write_text("db_password: not-a-path\nserver: x\n")  # a key, not a grep hit
    # unconfined: the rule is on the command's text (the sandbox's own tests run bubblewrap)
    return [*file_tools(tmp_path), shell_tool(tmp_path, sandbox=Unconfined())]


def _tool_texts(model: ScriptedModel) -> list[str]:
    return [m.content for m in model.requests[-1].messages if m.role == "tool"]


def _run(tmp_path: Path, first: Any, answer: str, *, hidden_values: bool = True) -> tuple[ScriptedModel, str]:
    model = ScriptedModel([first, answer])
    result = Agent(model, tools=_tools(tmp_path), policy=SafetyPolicy(approver=YES, environment={}, hidden_values=hidden_values),
                   limits=Limits(max_steps=4)).run("what does my .env configure?")
    return model, result.answer


@pytest.mark.parametrize("first", [
    call("Bash", command="cat .env"), call("Bash", command="grep PASS .env"), call("Bash", command="cat ./.env"),
    call("Bash", command='cat .e""nv'), call("Bash", command="sh -c 'cat .env'"), call("Bash", command="cat .en?"),
    call("Bash", command="cat $(echo .env)"), call("Bash", command="cp .env x && cat x"),
    call("Bash", command="base64 .env"), call("Read", file_path=".env"),
    # a search whose hits include lines of .env: known from its output (`path:text` lines), not its text
    call("Bash", command="grep -r PASS ."), call("Bash", command="grep -rn PASS ."), call("Grep", pattern="PASS"),
], ids=lambda c: f"{c.name}:{next(iter(c.arguments.values()))}")
def test_a_foreground_read_of_dotenv_is_a_secret_handle_and_its_values_are_redacted(tmp_path: Path,
                                                                                    first: Any) -> None:
    model, answer = _run(tmp_path, first, f"DB_PASS is {DB_PASS}.")
    (shown,) = _tool_texts(model)
    assert HANDLE.search(shown) and "secret" in shown, shown
    seen = "\n".join(m.content for r in model.requests for m in r.messages)
    assert DB_PASS not in seen and TOKEN not in seen and "localhost" not in seen, seen
    command = first.arguments.get("command", "")
    if not command.startswith("base64"):  # (its output holds the values encoded, not as they are: not known)
        assert re.fullmatch(r"DB_PASS is \[secret from [^\]]+ redacted\]\.", answer), answer


@pytest.mark.parametrize(("command", "shown"), [
    ("cat notes.txt", f"plain notes {DB_PASS}\n"), ("grep -r notes .", f"./notes.txt:plain notes {DB_PASS}\n"),
    ("cat settings.yaml", "db_password: not-a-path\nserver: x\n")])
def test_a_command_reading_no_secret_source_is_shown_as_before(tmp_path: Path, command: str, shown: str) -> None:
    model, answer = _run(tmp_path, call("Bash", command=command), "It says plain notes.")
    assert _tool_texts(model) == [shown]
    assert answer == "It says plain notes."


def test_the_visible_mode_shows_the_output_and_still_redacts_its_values(tmp_path: Path) -> None:
    model, answer = _run(tmp_path, call("Bash", command="cat .env"), f"DB_PASS is {DB_PASS}.", hidden_values=False)
    assert _tool_texts(model) == [DOTENV]
    assert answer == f"DB_PASS is {PLACEHOLDER}."


def test_the_ordinary_question_is_answered_through_the_quarantined_query(tmp_path: Path) -> None:
    """"Is DB_HOST set in .env?": the model asks the query about the handle and puts the answer's handle in
    its answer; the user reads the answer, the model never the file."""
    def step(request: Any) -> Any:
        tools = [m.content for m in request.messages if m.role == "tool"]
        if not tools:
            return call("Bash", command="grep -c DB_HOST .env; cat .env")
        if len(tools) == 1:
            return call("inspect_value", handle=HANDLE.search(tools[0]).group(),  # type: ignore[union-attr]
                        question="Is DB_HOST set?", answer_type="boolean")
        return f"Is DB_HOST set in .env: {HANDLE.search(tools[1]).group()}"  # type: ignore[union-attr]

    model = ScriptedModel(step)
    query = ScriptedModel(["true"])
    result = Agent(model, tools=_tools(tmp_path), policy=SafetyPolicy(approver=YES, environment={}, query_model=query),
                   limits=Limits(max_steps=5)).run("is DB_HOST set in .env?")
    assert any("DB_PASS=" + DB_PASS in m.content for r in query.requests for m in r.messages)  # the query read it
    seen = "\n".join(m.content for r in model.requests for m in r.messages)
    assert DB_PASS not in seen and "localhost" not in seen
    assert result.answer == "Is DB_HOST set in .env: true", result.answer


def test_the_environment_printed_by_a_command_is_a_secret(tmp_path: Path) -> None:
    key = "sk-live-4f9a8b7c6d5e4f3a2b1c"
    (tmp_path / "x").mkdir()
    tools = [shell_tool(tmp_path / "x", sandbox=Unconfined(), env={"PATH": "/usr/bin:/bin", "SERVICE_KEY": key})]
    for command in ("env", "printenv", "printenv SERVICE_KEY", "echo $SERVICE_KEY"):
        model = ScriptedModel([call("Bash", command=command), f"the key is {key}"])
        result = Agent(model, tools=tools, policy=SafetyPolicy(approver=YES, environment={}), limits=Limits(max_steps=4)).run("hi")
        (shown,) = _tool_texts(model)
        assert HANDLE.search(shown) and key not in shown, (command, shown)
        assert key not in result.answer, (command, result.answer)


@pytest.mark.parametrize(("command", "source"), [
    ("cat .env", ".env"), ("cat ./.env", ".env"), ('cat .e""nv', ".env"), ("cat '.e'nv", ".env"),
    ("cat $(echo .env)", ".env"), ("sh -c 'cat .env'", ".env"), ("cp .env x && cat x", ".env"),
    ("base64 .env", ".env"), ("cat .en?", ".en?"), ("cat config/*.env", "*.env"), ("head ~/.ssh/id_ed25519", "id_ed25519"),
    ("grep KEY config/.env", ".env"), ("python -c \"print(open('.env').read())\"", ".env"),
    ("env", ENVIRONMENT), ("printenv", ENVIRONMENT), ("env | grep KEY", ENVIRONMENT), ("bash -c env", ENVIRONMENT),
    ("set", ENVIRONMENT), ("export -p", ENVIRONMENT), ("echo $OPENAI_API_KEY", ENVIRONMENT),
    ("echo ${GITHUB_TOKEN}", ENVIRONMENT), ("cat /proc/self/environ", ENVIRONMENT),
])
def test_the_rule_names_the_source_a_command_reads(command: str, source: str) -> None:
    assert source in secret_sources_named("command", command)


@pytest.mark.parametrize("command", [
    "ls -la", "cat README.md", "cat .env.example", "echo $HOME", "for f in *; do echo $f; done",
    "set -euo pipefail; pytest -q", "export FOO=1", "cat *", "pip install -e .", "git config --get user.name",
    "make test ENV=dev", "docker run --env X=1 img", "env FOO=1 pytest -q", "/usr/bin/env python3 x.py",
    "conda env list", "X=1; echo $X", "for F in *.py; do wc -l $F; done", ". .venv/bin/activate",
])
def test_the_rule_leaves_commands_that_read_no_secret_source(command: str) -> None:
    assert secret_sources_named("command", command) == []


@pytest.mark.parametrize("command", ["cat $(printf '\\x2eenv')", "f=.e; cat ${f}nv", "grep -r KEY ."])
def test_what_the_rule_cannot_see_is_what_the_docs_say(command: str) -> None:
    """A name the shell computes, or a directory read whole: docs/hidden_values.md says so."""
    assert secret_sources_named("command", command) == []


def test_an_agent_with_a_tool_that_may_read_a_secret_gets_the_query_tool(tmp_path: Path) -> None:
    tools = _tools(tmp_path)
    assert {t.name: may_read_secrets(t) for t in tools} == {
        "Read": True, "Write": False, "Edit": False, "Glob": True, "Grep": True, "Bash": True}
    agent = Agent(ScriptedModel(["hi"]), tools=tools, policy=SafetyPolicy())
    assert "inspect_value" in agent.executor.tools and "call_if" not in agent.executor.tools  # (for untrusted data)


def test_a_yes_no_about_a_secret_is_shown_to_the_user_and_nothing_longer() -> None:
    from tether.values import ValueStore
    from tether.values._labels import secret

    store = ValueStore(enabled=True)
    store.hide("$v1_1", DOTENV, secret(".env"), "output of Bash(command=\"cat .env\")")
    store.hide("$v2_1", "true", secret(".env"), "answer of inspect_value(...)")
    text, withheld = store.render("set: $v2_1; file: $v1_1")
    assert text == "set: true; file: [$v1_1: a secret value, not shown]" and withheld == ["$v1_1"]
