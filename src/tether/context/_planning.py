"""Planner-executor mode: a plan written first by one structured call, each step run by the loop with
its own step budget carved from the run's, re-planning when a step fails. (The plain mode is
`Agent.run` itself.)

    result = await Planner(agent).arun("Find why checkout fails and write it up")
    result.task_state        # the plan, each step's status, result and attempts

Each step is an ordinary run of the loop (same model, tools, policy) whose prompt carries the task
state; its answer is the step's result, and an answer starting with FAILED (or any stop other than
completed) fails the step. Planner calls go through the agent's step runner like any model call.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

from tether._agent import Agent
from tether._errors import TetherError
from tether._loop import run_loop
from tether._types import Message, ModelReply, ModelRequest, RunResult, StopReason, Usage
from tether.context._task_state import TaskState, parse_steps
from tether.events import TraceEvent
from tether.models._base import Model

PLAN_SYSTEM = (
    "You are the planner. Break the task into a few concrete steps another agent will carry out one "
    "at a time with tools. Reply with JSON only, no prose: "
    '{"goal": "<the goal in one line>", "steps": [{"id": "s1", "title": "<what to do>", '
    '"depends_on": []}, ...]}. Use at most {max_steps} steps; keep step ids short and unique.'
)
REPLAN = (
    "Step {step} failed: {why}\n\nThe task state so far:\n{state}\n\nWrite a new plan for what is left. "
    "Steps already done are kept; do not repeat them (you may reuse their ids as dependencies)."
)
STEP_PROMPT = (
    "Overall task: {task}\n\n{state}\n\nDo step {id} now: {title}\nWhen it is done, answer with what it "
    "established (keep ids, numbers and names exactly). If it cannot be done, answer starting with FAILED: "
    "and say why."
)
FINAL_PROMPT = (
    "Task: {task}\n\n{state}\n\nAll steps are done. Using only their results above, write the final answer."
)
_JSON = re.compile(r"\{.*\}", re.DOTALL)


class PlanError(TetherError, ValueError):
    """The planner's reply was not a usable plan."""


def parse_plan(text: str) -> tuple[str, list[Any]]:
    """(goal, raw steps) from a planner reply: JSON, possibly inside prose or a code fence."""
    match = _JSON.search(text)
    if match is None:
        raise PlanError("no JSON object in the planner's reply")
    try:
        data = json.loads(match.group())
    except json.JSONDecodeError as exc:
        raise PlanError(f"the plan is not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list) or not data["steps"]:
        raise PlanError('the plan needs a non-empty "steps" list')
    return str(data.get("goal", "")), data["steps"]


@dataclass
class Planner:
    """Runs `agent` in planner-executor mode. `planner_model` defaults to the agent's model;
    `max_plan_steps` caps a plan's length; `max_replans` bounds re-planning after failures."""

    agent: Agent
    planner_model: Model | None = None
    max_plan_steps: int = 8
    max_replans: int = 2
    min_step_budget: int = 2

    def run(self, prompt: str, **kwargs: Any) -> RunResult:
        return asyncio.run(self.arun(prompt, **kwargs))

    async def arun(self, prompt: str, *, run_id: str | None = None) -> RunResult:
        run_id = run_id or uuid.uuid4().hex[:12]
        limits = self.agent.limits
        total_steps = limits.max_steps
        usage = Usage()
        trace: list[TraceEvent] = []
        messages: list[Message] = []
        findings: list[str] = []
        state = TaskState()
        calls = 0  # model calls made so far (planner and steps): the run's step count

        async def plan_call(text: str) -> ModelReply:
            nonlocal calls
            model = self.planner_model or self.agent.model
            request = ModelRequest([Message.system(PLAN_SYSTEM.replace("{max_steps}", str(self.max_plan_steps))),
                                    Message.user(text)], [])
            reply = await self.agent.step_runner.model_step(calls, lambda: model.complete(request))
            calls += 1
            reply.usage.cost_usd = self.agent.pricing.usage_cost(reply.model or model.name, reply.usage) or \
                reply.usage.cost_usd
            usage.add(Usage(reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cost_usd, 1))
            trace.append(TraceEvent("model_call", calls, 0.0, 0.0, {"purpose": "plan", "model": model.name,
                                                                   "input_tokens": reply.usage.input_tokens}))
            return reply

        async def make_plan(text: str) -> str | None:
            """Ask for a plan (one retry on a malformed one); None when it worked, else why not."""
            why = ""
            for _ in range(2):
                reply = await plan_call(text if not why else f"{text}\n\nYour last plan was unusable: {why}. "
                                        "Reply with the JSON object only.")
                try:
                    goal, raw = parse_plan(reply.text)
                    state.set_plan(parse_steps(raw[: self.max_plan_steps]), goal or state.goal or prompt)
                    return None
                except (PlanError, ValueError, json.JSONDecodeError) as exc:
                    why = str(exc)
            return why

        def finish(stop: StopReason, answer: str, error: str | None = None) -> RunResult:
            return RunResult(run_id=run_id, stop_reason=stop, answer=answer, findings=findings, usage=usage,
                             messages=messages, trace=trace, error=error, steps=calls, task_state=state.to_dict())

        try:
            problem = await make_plan(prompt)
        except Exception as exc:
            return finish(StopReason.ERROR, "", f"planner call failed: {type(exc).__name__}: {exc}")
        if problem is not None:
            return finish(StopReason.ERROR, "", f"the planner wrote no usable plan: {problem}")

        replans = 0
        last: RunResult | None = None
        while not state.finished:
            ready = state.ready()
            if not ready:  # what is left depends on a failed step
                return finish(StopReason.ERROR, last.answer if last else "", "the plan cannot go on: the steps "
                              "left depend on failed ones")
            step = ready[0]
            left = None if total_steps is None else total_steps - calls
            pending = sum(1 for s in state.steps if s.status == "pending")
            if left is not None and left < self.min_step_budget:
                return finish(StopReason.MAX_STEPS, last.answer if last else "", None)
            budget = None if left is None else max(self.min_step_budget, left // pending)
            state.update(step.id, "running")
            spec = replace(self.agent._spec(f"{run_id}:{step.id}:{step.attempts}", None, None, False),
                           limits=replace(limits, max_steps=budget))
            last = await run_loop(spec, self.agent.start_messages(STEP_PROMPT.format(
                task=prompt, state=state.render(), id=step.id, title=step.title)))
            calls += last.steps
            usage.add(last.usage)
            trace.extend(last.trace)
            messages.extend(last.messages)
            findings.extend(last.findings)
            if last.completed and not last.answer.lstrip().upper().startswith("FAILED"):
                state.update(step.id, "done", last.answer.strip()[:600])
                continue
            why = last.answer.strip()[:400] or last.error or last.stop_reason.value
            state.update(step.id, "failed", why)
            if last.stop_reason in (StopReason.CANCELLED, StopReason.AWAITING_APPROVAL):
                return finish(last.stop_reason, last.answer, last.error)
            if replans >= self.max_replans:
                return finish(StopReason.ERROR, last.answer, f"step {step.id} failed and re-planning is used up: {why}")
            replans += 1
            try:
                problem = await make_plan(REPLAN.format(step=step.id, why=why, state=state.render()))
            except Exception as exc:
                return finish(StopReason.ERROR, last.answer, f"planner call failed: {type(exc).__name__}: {exc}")
            if problem is not None:
                return finish(StopReason.ERROR, last.answer, f"re-planning failed: {problem}")

        final = await run_loop(replace(self.agent._spec(f"{run_id}:final", None, None, False),
                                       limits=replace(limits, max_steps=1)),
                               self.agent.start_messages(FINAL_PROMPT.format(task=prompt, state=state.render())))
        calls += final.steps
        usage.add(final.usage)
        trace.extend(final.trace)
        messages.extend(final.messages)
        answer = final.answer or (last.answer if last else "")
        return finish(StopReason.COMPLETED if final.answer else final.stop_reason, answer, final.error)
