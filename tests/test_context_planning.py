"""Planner-executor mode: a plan first, each step with a carved budget, re-planning on failure."""

from __future__ import annotations

import json

from tether import Agent, Limits, tool
from tether._types import ModelReply, ModelRequest, StopReason, ToolCall
from tether.context import Planner, TaskState, parse_plan
from tether.models._scripted import ScriptedModel


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return {"host": "db-07", "version": "v2.14.3"}.get(key, "not found")


def plan(*steps: tuple[str, str, list[str]]) -> str:
    return "Here is the plan:\n```json\n" + json.dumps(
        {"goal": "explain the outage", "steps": [{"id": i, "title": t, "depends_on": d} for i, t, d in steps]}) + "\n```"


class Scripted:
    """Plays planner and executor: replies by what the request is."""

    def __init__(self, fail_first: str | None = None) -> None:
        self.plans = 0
        self.fail_first = fail_first
        self.failed = False
        self.step_limits: list[str] = []
        self.model = ScriptedModel(self.reply)

    def reply(self, request: ModelRequest) -> ModelReply:
        first = request.messages[0].content
        last = request.messages[-1]
        if first.startswith("You are the planner"):
            self.plans += 1
            if self.plans == 1:
                return ModelReply(plan(("s1", "find the host", []), ("s2", "find the version", ["s1"]),
                                       ("s3", "write it up", ["s2"])))
            assert "Step s2 failed" in last.content and "[x] s1" in last.content
            return ModelReply(plan(("s1", "find the host", []), ("s2b", "find the version another way", ["s1"]),
                                   ("s3", "write it up", ["s2b"])))
        if last.role == "tool":
            return ModelReply(f"established: {last.content}")
        prompt = last.content
        if "All steps are done" in prompt:
            return ModelReply("Outage: db-07 after v2.14.3.")
        step = prompt.split("Do step ", 1)[1].split(" now", 1)[0]
        if step == self.fail_first and not self.failed:
            self.failed = True
            return ModelReply("FAILED: the deploy log is gone")
        key = {"s1": "host", "s2": "version", "s2b": "version"}.get(step)
        if key:
            return ModelReply("", [ToolCall(f"c-{step}", "lookup", {"key": key})])
        assert "db-07" in prompt and "v2.14.3" in prompt  # earlier results reach later steps
        return ModelReply("written up")


def test_plan_then_execute_each_step() -> None:
    s = Scripted()
    result = Planner(Agent(s.model, tools=[lookup], limits=Limits(max_steps=20))).run("why did checkout fail?")
    assert result.completed, result.error
    assert result.answer == "Outage: db-07 after v2.14.3."
    state = TaskState.from_dict(result.task_state or {})
    assert [(x.id, x.status) for x in state.steps] == [("s1", "done"), ("s2", "done"), ("s3", "done")]
    assert "db-07" in state.step("s1").result
    assert result.steps == s.model.calls and s.plans == 1


def test_a_failed_step_triggers_a_replan_that_keeps_done_steps() -> None:
    s = Scripted(fail_first="s2")
    result = Planner(Agent(s.model, tools=[lookup], limits=Limits(max_steps=30))).run("why did checkout fail?")
    assert result.completed, result.error
    state = TaskState.from_dict(result.task_state or {})
    assert s.plans == 2
    assert [x.id for x in state.steps] == ["s1", "s2b", "s3"]
    assert state.step("s1").attempts == 1  # kept, not run again
    assert all(x.status == "done" for x in state.steps)


def test_each_step_gets_a_budget_carved_from_the_run(monkeypatch) -> None:
    import tether.context._planning as planning

    seen: list[int | None] = []
    real = planning.run_loop

    async def spying(spec, messages, **kw):
        seen.append(spec.limits.max_steps)
        return await real(spec, messages, **kw)

    monkeypatch.setattr(planning, "run_loop", spying)
    s = Scripted()
    result = Planner(Agent(s.model, tools=[lookup], limits=Limits(max_steps=13))).run("why?")
    assert result.completed
    # 13 steps: 1 for the plan, then 12 over 3 pending steps = 4 each; what a step leaves is re-carved
    assert seen[0] == 4 and seen[1] == (13 - 1 - 2) // 2 and seen[-1] == 1
    assert result.steps <= 13


def test_an_unusable_plan_is_one_clear_error() -> None:
    model = ScriptedModel(["no plan here", "still nothing"])
    result = Planner(Agent(model)).run("do it")
    assert result.stop_reason is StopReason.ERROR and "no usable plan" in (result.error or "")
    assert parse_plan('x {"steps": [{"id": "a", "title": "t"}]} y')[1][0]["id"] == "a"


def test_running_out_of_replans_stops_with_the_reason() -> None:
    def always_fail(request: ModelRequest) -> ModelReply:
        if request.messages[0].content.startswith("You are the planner"):
            return ModelReply(plan(("s1", "impossible", [])))
        return ModelReply("FAILED: cannot")

    result = Planner(Agent(ScriptedModel(always_fail)), max_replans=1).run("do it")
    assert result.stop_reason is StopReason.ERROR and "re-planning is used up" in (result.error or "")
    assert TaskState.from_dict(result.task_state or {}).step("s1").attempts == 2
