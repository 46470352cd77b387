"""Issue 24, item 5: a recovered durable run gets its tool results from the record and never runs
the tool functions again, so the task state (plan, facts) must follow from the transcript. A step
runner that replays recorded results, as DBOS does, shows it."""

from __future__ import annotations

from tether import Agent, Limits
from tether._loop import DirectStepRunner
from tether._types import ToolResult
from tether.context import Compaction
from tether.models._scripted import ScriptedModel, call


class Replaying(DirectStepRunner):
    """Answers the task-state tools from a record, without running them (a recovery's replay)."""

    async def tool_step(self, step, index, call, run):  # type: ignore[no-untyped-def]
        if call.name == "record_fact":
            return ToolResult(call.id, call.name, "recorded (1 facts)")
        if call.name == "update_plan":
            return ToolResult(call.id, call.name, "plan has 2 steps; next: a")
        return await run()


def test_the_task_state_of_a_replayed_run_follows_from_its_transcript() -> None:
    compaction = Compaction()
    script = [call("update_plan", steps=[{"id": "a", "title": "find the host"}, {"id": "b", "title": "fix it"}]),
              call("record_fact", key="failing host", value="db-07"), "db-07 is failing"]
    agent = Agent(ScriptedModel(script), tools=compaction.tools(), context=compaction, step_runner=Replaying(),
                  limits=Limits(max_steps=5))
    result = agent.run("which host fails?")
    assert result.completed
    assert result.task_state is not None
    assert result.task_state["facts"] == {"failing host": "db-07"}
    assert [s["id"] for s in result.task_state["steps"]] == ["a", "b"]
