"""Hidden values at their edges (issue 44 leftovers): the handle line names inspect_value only when the
agent has it; handles are never spliced into a shell command; a background job's output hides by the
same rule as the foreground call's."""

from __future__ import annotations

from typing import Any

from test_hidden_values import World, handle_in

from tether._agent import Agent
from tether._limits import Limits
from tether.models._scripted import ScriptedModel, call
from tether.policy import SafetyPolicy
from tether.tools._executor import Executor

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
