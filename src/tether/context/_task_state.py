"""Task state: an explicit plan (steps with ids, dependencies, status, results, attempts) and the
facts established so far, shown to the model as a compact block instead of the raw transcript.

`TaskState` round-trips through JSON (`to_json` / `from_json`) so a run store can keep it with the
run. `task_state_tools(board)` gives the model `update_plan`, `set_step` and `record_fact`; they
find the run's state on a `TaskBoard` by run id, so one Agent serves many runs.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from tether._errors import InvalidInput, MissingKey
from tether._types import Effect, from_json, from_jsonable, to_json, to_jsonable
from tether.tools._base import Tool, ToolContext, tool

StepStatus = Literal["pending", "running", "done", "failed", "skipped"]
STATUSES: tuple[str, ...] = ("pending", "running", "done", "failed", "skipped")
_MARK = {"pending": " ", "running": ">", "done": "x", "failed": "!", "skipped": "-"}


@dataclass(slots=True)
class PlanStep:
    """One step of the plan. `depends_on` names step ids that must be done first."""

    id: str
    title: str
    depends_on: list[str] = field(default_factory=list)
    status: StepStatus = "pending"
    result: str = ""
    attempts: int = 0


@dataclass(slots=True)
class TaskState:
    """The plan and the established facts of one run."""

    goal: str = ""
    steps: list[PlanStep] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    version: int = 1

    # ----- plan ---------------------------------------------------------------------------------

    def step(self, step_id: str) -> PlanStep:
        for s in self.steps:
            if s.id == step_id:
                return s
        known = ", ".join(s.id for s in self.steps) or "none"
        raise MissingKey(f"no plan step '{step_id}' (steps: {known})")

    def set_plan(self, steps: list[PlanStep], goal: str | None = None) -> None:
        """Replace the plan; steps already done keep their status and result, and every step kept
        by id keeps its attempts."""
        ids = [s.id for s in steps]
        if len(set(ids)) != len(ids):
            raise InvalidInput(f"plan step ids must be unique, got {ids}")
        for s in steps:
            missing = [d for d in s.depends_on if d not in ids]
            if missing:
                raise InvalidInput(f"step '{s.id}' depends on unknown step(s) {missing}")
        _check_acyclic(steps)
        old = {s.id: s for s in self.steps}
        for s in steps:
            prev = old.get(s.id)
            if prev is None:
                continue
            if prev.status == "done" and s.status == "pending":
                s.status, s.result = prev.status, prev.result
            s.attempts = max(s.attempts, prev.attempts)  # a re-planned step remembers its tries
        self.steps = steps
        if goal is not None:
            self.goal = goal

    def update(self, step_id: str, status: str, result: str = "") -> PlanStep:
        if status not in STATUSES:
            raise InvalidInput(f"status must be one of {', '.join(STATUSES)}, got '{status}'")
        s = self.step(step_id)
        if status == "running":
            s.attempts += 1
        s.status = status  # type: ignore[assignment]
        if result:
            s.result = result
        return s

    def ready(self) -> list[PlanStep]:
        """Pending steps whose dependencies are all done, in plan order."""
        done = {s.id for s in self.steps if s.status in ("done", "skipped")}
        return [s for s in self.steps if s.status == "pending" and all(d in done for d in s.depends_on)]

    @property
    def finished(self) -> bool:
        return bool(self.steps) and all(s.status in ("done", "skipped") for s in self.steps)

    # ----- facts --------------------------------------------------------------------------------

    def record(self, key: str, value: str) -> None:
        key = key.strip()
        if not key:
            raise InvalidInput("a fact needs a non-empty key")
        self.facts[key] = str(value).strip()

    # ----- shown to the model -------------------------------------------------------------------

    @property
    def empty(self) -> bool:
        return not (self.goal or self.steps or self.facts)

    def render(self) -> str:
        """The compact block the model sees each call."""
        lines = ["# Task state"]
        if self.goal:
            lines.append(f"Goal: {self.goal}")
        if self.steps:
            lines.append("Plan:")
            for s in self.steps:
                deps = f" (after {', '.join(s.depends_on)})" if s.depends_on else ""
                tries = f" [attempt {s.attempts}]" if s.attempts > 1 else ""
                result = f" -> {s.result}" if s.result else ""
                lines.append(f"- [{_MARK[s.status]}] {s.id}: {s.title}{deps}{tries}{result}")
        if self.facts:
            lines.append("Established facts:")
            lines.extend(f"- {k}: {v}" for k, v in self.facts.items())
        return "\n".join(lines)

    # ----- JSON ---------------------------------------------------------------------------------

    def to_json(self) -> str:
        return to_json(self)

    @classmethod
    def from_json(cls, data: str | bytes) -> TaskState:
        return from_json(cls, data)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = to_jsonable(self)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskState:
        return from_jsonable(cls, data)


def _check_acyclic(steps: list[PlanStep]) -> None:
    deps = {s.id: s.depends_on for s in steps}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == 2:
            return
        if state.get(node) == 1:
            raise InvalidInput(f"plan has a dependency cycle: {' -> '.join([*path, node])}")
        state[node] = 1
        for d in deps[node]:
            visit(d, [*path, node])
        state[node] = 2

    for s in steps:
        visit(s.id, [])


class TaskBoard:
    """The task states of the runs in flight, by run id (the tools find theirs here)."""

    __slots__ = ("_live", "_states")

    def __init__(self) -> None:
        self._states: dict[str, TaskState] = {}
        self._live: dict[str, set[str]] = {}  # run id -> calls whose tool function ran in this process

    def ran(self, run_id: str, call_id: str) -> None:
        """A task-state tool's function ran for this call (so replaying it would apply it twice)."""
        self._live.setdefault(run_id, set()).add(call_id)

    def applied(self, run_id: str, call_id: str) -> bool:
        return call_id in self._live.get(run_id, ())

    def open(self, run_id: str, state: TaskState | None = None) -> TaskState:
        current = self._states.get(run_id)
        if current is None or state is not None:
            current = state or TaskState()
            self._states[run_id] = current
        return current

    def get(self, run_id: str) -> TaskState:
        return self._states.setdefault(run_id, TaskState())

    def close(self, run_id: str) -> TaskState | None:
        self._live.pop(run_id, None)
        return self._states.pop(run_id, None)


def parse_steps(raw: Any) -> list[PlanStep]:
    """Plan steps from the model: a list of {"id", "title", "depends_on"} (or a JSON string of one)."""
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("steps must be a non-empty list of {id, title, depends_on}")
    steps = []
    for i, item in enumerate(raw, 1):
        if isinstance(item, str):
            item = {"id": str(i), "title": item}
        if not isinstance(item, dict) or not str(item.get("title", "")).strip():
            raise InvalidInput(f"step {i} needs a title")
        deps = item.get("depends_on") or []
        if isinstance(deps, str):
            deps = [deps]
        steps.append(PlanStep(str(item.get("id") or i), str(item["title"]).strip(), [str(d) for d in deps]))
    return steps


TASK_TOOLS = ("update_plan", "set_step", "record_fact")


def apply_task_call(state: TaskState, name: str, args: dict[str, Any]) -> None:
    """Apply one task-state call, as its tool did, to `state` (the context builder replays them from
    the transcript: a recovered durable run gets its tool results from the record and never runs the
    tool functions, so the state must follow from the transcript). Calls whose function ran in this process (`TaskBoard.applied`)
    are not applied again."""
    with contextlib.suppress(KeyError, ValueError, TypeError, json.JSONDecodeError):  # the tool said so then
        if name == "update_plan":
            state.set_plan(parse_steps(args.get("steps")), args.get("goal") or None)
        elif name == "set_step":
            state.update(str(args["step_id"]), str(args["status"]), str(args.get("result", "")))
        elif name == "record_fact":
            state.record(str(args["key"]), str(args["value"]))


def task_state_tools(board: TaskBoard) -> list[Tool]:
    """Tools the model uses to keep its plan and facts (run-local notes: no effect on the world)."""

    @tool(effect=Effect.READ_ONLY)  # changes only the run's own notes, nothing in the world
    def update_plan(steps: list[dict[str, Any]], context: ToolContext, goal: str = "") -> str:
        """Write or replace the plan. Steps done so far keep their results.

        Args:
            steps: the steps in order, each {"id": "s1", "title": "...", "depends_on": ["s0"]}.
            goal: the task's goal in one line (optional).
        """
        state = board.get(context.run_id)
        board.ran(context.run_id, context.call_id)
        try:
            state.set_plan(parse_steps(steps), goal or None)
        except (ValueError, json.JSONDecodeError) as exc:
            return f"ERROR: plan not changed: {exc}"
        return f"plan has {len(state.steps)} steps; next: {', '.join(s.id for s in state.ready()) or 'none'}"

    @tool(effect=Effect.READ_ONLY)  # changes only the run's own notes, nothing in the world
    def set_step(step_id: str, status: str, context: ToolContext, result: str = "") -> str:
        """Mark a plan step running, done, failed or skipped, with its result.

        Args:
            step_id: the step's id.
            status: running, done, failed, skipped or pending.
            result: what the step established (ids, numbers, names), or why it failed.
        """
        state = board.get(context.run_id)
        board.ran(context.run_id, context.call_id)
        try:
            s = state.update(step_id, status, result)
        except (KeyError, ValueError) as exc:
            return f"ERROR: {exc.args[0]}"
        return f"step {s.id} is {s.status}; next: {', '.join(x.id for x in state.ready()) or 'none'}"

    @tool(effect=Effect.READ_ONLY)  # changes only the run's own notes, nothing in the world
    def record_fact(key: str, value: str, context: ToolContext) -> str:
        """Record an established fact (an id, number, name, timestamp or hypothesis) so it stays in view.

        Args:
            key: a short name for the fact, e.g. "failing host".
            value: the fact itself, exactly (keep ids and numbers verbatim).
        """
        state = board.get(context.run_id)
        board.ran(context.run_id, context.call_id)
        try:
            state.record(key, value)
        except ValueError as exc:
            return f"ERROR: {exc}"
        return f"recorded ({len(state.facts)} facts)"

    return [update_plan, set_step, record_fact]
