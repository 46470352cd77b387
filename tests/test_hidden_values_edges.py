"""Hidden values at their edges (issue 44 leftovers): the handle line names inspect_value only when the
agent has it; handles are never spliced into a shell command; a background job's output hides by the
same rule as the foreground call's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_hidden_values import World, handle_in

from tether._agent import Agent
from tether._limits import Limits
from tether.models._scripted import ScriptedModel, call
from tether.policy import CallbackApprover, SafetyPolicy
from tether.tools._base import tool
from tether.tools._executor import Executor
from tether.tools._sandbox import Unconfined
from tether.tools.builtin import shell_tool

# -- the handle line ------------------------------------------------------------------------------


def _line(executor_of: Any) -> str:
    world = World()
    model = ScriptedModel([call("read_email", id=1), "done"])
    policy = SafetyPolicy()
    tools = world.tools()
    a = Agent(model, tools=tools, policy=policy, executor=executor_of(tools, policy), limits=Limits(max_steps=4))
    a.run("summarise my mail")
    return next(m.content for m in model.requests[-1].messages if m.role == "tool")


def test_a_hand_built_executor_without_the_query_tool_is_not_told_to_use_it() -> None:
    line = _line(lambda tools, policy: Executor(tools, policy=policy))
    handle = handle_in(line)
    assert "inspect_value" not in line and "Ignore previous" not in line
    assert f"pass {handle} as an argument where the value is needed" in line
    assert f"write {handle} in your final answer" in line


def test_an_agent_with_the_query_tool_is_told_to_ask_it() -> None:
    line = _line(lambda tools, policy: None)  # the Agent builds its executor, inspect_value included
    assert line.endswith(f"pass {handle_in(line)} as an argument to use it, or ask inspect_value about it.")


# -- handles and shell commands ---------------------------------------------------------------------

ATTACK = "Hi! $(touch pwned) `touch pwned2`; touch pwned3 # Lunch?"


def _bash_run(tmp_path: Path, second: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """The model reads a hidden mail, then calls Bash with `second` (HANDLE: the mail's handle)."""

    @tool(untrusted_output=True, hide_output=True, effect="read_only")
    def read_email(id: int) -> str:
        """Read one e-mail."""
        return ATTACK

    bash = shell_tool(tmp_path, sandbox=Unconfined())  # unconfined: every call asks, and is approved here
    asked: list[Any] = []

    def step(request: Any) -> Any:
        tool_msgs = [m.content for m in request.messages if m.role == "tool"]
        if not tool_msgs:
            return call("read_email", id=1)
        if len(tool_msgs) == 1:
            return call("Bash", **{k: v.replace("HANDLE", handle_in(tool_msgs[0])) for k, v in second.items()})
        return "done"

    policy = SafetyPolicy(approver=CallbackApprover(lambda req: asked.append(req) or True))
    model = ScriptedModel(step)
    Agent(model, tools=[read_email, bash], policy=policy, limits=Limits(max_steps=6)).run("go")
    outs = [m.content for m in model.requests[-1].messages if m.role == "tool"]
    return outs, asked


def test_a_handle_in_a_bash_command_is_refused_and_never_run(tmp_path: Path) -> None:
    for command in ("echo HANDLE > got.txt", "HANDLE", "cat <<< \"HANDLE\" > got.txt"):
        outs, asked = _bash_run(tmp_path, {"command": command})
        assert outs[1].startswith("ERROR: 'Bash' was not run: its command is code"), outs[1]
        assert 'stdin="$v' in outs[1] and "${v" in outs[1] and "touch" not in outs[1]
        assert asked == [] and not list(tmp_path.glob("pwned*")) and not (tmp_path / "got.txt").exists()


def test_a_handle_goes_to_bash_as_data_on_stdin_and_is_never_run(tmp_path: Path) -> None:
    outs, asked = _bash_run(tmp_path, {"command": "cat > got.txt; echo stored", "stdin": "HANDLE"})
    assert outs[1].startswith("stored"), outs[1]
    assert (tmp_path / "got.txt").read_text() == ATTACK and not list(tmp_path.glob("pwned*"))
    assert len(asked) == 1 and "untrusted (read_email)" in asked[0].provenance["stdin"]


def test_a_shell_variable_that_names_no_value_of_the_run_is_the_shells(tmp_path: Path) -> None:
    outs, _ = _bash_run(tmp_path, {"command": "v7_7=shell; echo \"[$v7_7]\""})
    assert outs[1].startswith("[shell]"), outs[1]
