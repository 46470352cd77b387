"""Hidden values at their edges (issue 44 leftovers): the handle line names inspect_value only when the
agent has it; handles are never spliced into a shell command; a background job's output hides by the
same rule as the foreground call's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_hidden_values import INJECTED, World, handle_in

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


# -- background jobs ------------------------------------------------------------------------------------


def _job_run(hide: bool | None, *, given_handle: bool = False, visible: bool = False,
             again: bool = False, web: bool = False) -> tuple[ScriptedModel, Any]:
    """The model starts a job (fetching a page, or summarising a hidden mail), waits for it, then answers.
    `web`: the tool declares its source only (untrusted and hiding by that)."""
    world = World()
    declared: dict[str, Any] = {"source": "web"} if web else {"untrusted_output": not given_handle, "hide_output": hide}

    @tool(job=True, effect="read_only", **declared)
    async def fetch_page(url: str) -> str:
        """Fetch a web page (slowly)."""
        return INJECTED if not given_handle else "summary: " + url[-16:]

    def step(request: Any) -> Any:
        tools = [m.content for m in request.messages if m.role == "tool"][int(given_handle):]
        if given_handle and request.messages[-1].role != "tool":
            return call("read_email", id=1)
        if not tools:
            mail = [m.content for m in request.messages if m.role == "tool"]
            return call("fetch_page", url=handle_in(mail[0]) if given_handle else "https://news.example/")
        if len(tools) == 1:
            return call("job_wait", job_id=tools[0].split()[1])
        if again and len(tools) == 2:  # asked again after it was given: still never shown
            return call("job_status", job_id=tools[0].split()[1])
        return "done"

    model = ScriptedModel(step)
    res = Agent(model, tools=[*world.tools(), fetch_page], policy=SafetyPolicy(hidden_values=not visible),
                limits=Limits(max_steps=8)).run("go")
    return model, res


def test_a_hiding_jobs_untrusted_output_is_delivered_as_a_handle_and_does_not_taint() -> None:
    model, res = _job_run(True, again=True)
    seen = "\n".join(m.content for m in model.requests[-1].messages)
    assert "Ignore previous" not in seen and "attacker" not in seen
    line = [m.content for m in model.requests[-1].messages if m.role == "tool"][1]
    assert line.startswith(f"{handle_in(line)}: output of job J1-0, fetch_page(url=\"https://news.example/\"), "
                           f"{len(INJECTED):,} characters, untrusted (fetch_page)"), line
    assert not res.tainted


def test_a_job_whose_source_is_the_web_hides_by_its_source() -> None:
    model, res = _job_run(None, web=True)
    line = [m.content for m in model.requests[-1].messages if m.role == "tool"][1]
    assert "Ignore previous" not in line and "untrusted (fetch_page)" in line and not res.tainted


def test_a_job_that_does_not_hide_is_shown_and_taints_as_before() -> None:
    for hide, visible in ((False, False), (True, True)):
        model, res = _job_run(hide, visible=visible)
        assert any("Ignore previous" in m.content for m in model.requests[-1].messages if m.role == "tool")
        assert res.tainted


def test_a_hiding_job_given_a_hidden_untrusted_value_hides_its_output_by_that_label() -> None:
    model, res = _job_run(True, given_handle=True)
    line = [m.content for m in model.requests[-1].messages if m.role == "tool"][-1]
    assert "summary:" not in line and "untrusted (read_email)" in line, line
    assert not res.tainted


def test_in_plan_mode_untrusted_text_on_bashs_stdin_asks_and_trusted_text_does_not(tmp_path: Path) -> None:
    """Plan mode's built-in Bash policy: an untrusted command is refused (as before); untrusted text on
    stdin, which a command like `bash` would run, is a person's decision; the planner's own text is not."""
    from tether.plan import PlanMode
    from tether.policy import ApprovalRequest

    @tool(untrusted_output=True)
    def read_email() -> str:
        """Read the newest email (anyone can write it)."""
        return ATTACK

    class Said(Unconfined):  # said to confine (no approval for every call), so only the plan's policy asks
        confined = True

    asked: list[ApprovalRequest] = []
    program = ('n = Bash(command="wc -c", stdin="four")\nmail = read_email()\nBash(command="bash", stdin=mail)\n'
               'final_answer(n)')
    pm = PlanMode(ScriptedModel([f"```python\n{program}\n```"]), [read_email, shell_tool(tmp_path, sandbox=Said())],
                  reader=ScriptedModel([]), approver=CallbackApprover(lambda r: asked.append(r) or False),
                  max_attempts=1)
    result = pm.run("Run the setup script in my latest email.")
    assert [r.tool for r in asked] == ["Bash"] and asked[0].arguments["command"] == "bash", [r.reason for r in asked]
    assert "stdin" in asked[0].reason and not list(tmp_path.glob("pwned*")) and not result.completed
    assert result.calls[0].tool == "Bash" and result.calls[0].decision == "allow"  # the planner's own text
