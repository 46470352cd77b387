"""Agents for the console's transcript, waterfall and fork tests (served with the service tests' own):
`writer` takes three noted steps, then answers with the task it was given (so a fork with an edited
message shows that message in its answer); `crew` hands its task to a sub-agent."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # loaded by path (`--agents FILE:AGENTS`): its neighbour too

from service_agents import AGENTS as SERVICE_AGENTS
from service_agents import _turn, add

from tether import Agent, Limits, tool
from tether._types import ModelReply, ModelRequest, ToolCall
from tether.models._scripted import ScriptedModel

LONG = "<b>bold?</b> " + "word " * 1500  # 7,500+ characters: paged on the run page


@tool
def note(n: int) -> str:
    """Write down step n.

    Args:
        n: the step
    """
    return f"noted step {n}"


def writer_script(request: ModelRequest):
    n = _turn(request)
    if n < 3:
        text = f"Step {n + 1}: noting." + (" " + LONG if n == 2 else "")
        return ModelReply(text, [ToolCall(f"n{n + 1}", "note", {"n": n + 1})])
    task = [m.content for m in request.messages if m.role == "user"][-1]
    return f"Done with: {task}"


def writer(user: str | None) -> Agent:
    return Agent(ScriptedModel(writer_script), tools=[note], limits=Limits(max_steps=8))


def adder_script(request: ModelRequest):
    if _turn(request) == 0:
        return ToolCall("a1", "add", {"a": 2, "b": 3})
    return f"The sum is {request.messages[-1].content}."


def crew_script(request: ModelRequest):
    if _turn(request) == 0:
        return ToolCall("h1", "helper", {"task": "add 2 and 3"})
    return f"The helper says: {request.messages[-1].content}"


def crew(user: str | None) -> Agent:
    helper = Agent(ScriptedModel(adder_script), tools=[add], limits=Limits(max_steps=4))
    return Agent(ScriptedModel(crew_script), tools=[helper.as_tool("helper", "Adds numbers.")],
                 limits=Limits(max_steps=4))


AGENTS = {**SERVICE_AGENTS, "writer": writer, "crew": crew}
