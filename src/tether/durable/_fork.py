"""Fork: a new run from step N of a stored durable run. The first N model calls (and the tool runs
of their turns) are served from the original's recorded steps, not paid for again; the loop, the
policy checks and the after-call updates run over them as in the original, so the fork has the same
state at N (taint included). After N the fork runs live: with the agent you pass (another model,
say) and, optionally, one more user message before step N+1."""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from dbos import DBOSClient, DBOSPortableJSONSerializer

from tether._errors import InvalidInput, NotFound, OperationFailed
from tether._loop import ChildRun, DirectStepRunner, run_loop
from tether._types import Message, ModelReply, RunResult, RunState, ToolCall, ToolResult, from_jsonable
from tether.policy._policy import NOTE_PREFIX
from tether.store._sql import engine_url


class Recorded:
    """A durable run's recorded model replies and tool results, turn by turn."""

    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.replies: list[ModelReply] = []
        self.tools: list[dict[str, ToolResult]] = []  # per model step: call id -> result
        for step in sorted(steps, key=lambda s: s["function_id"]):
            name, out = step["function_name"], step.get("output")
            if not isinstance(out, dict):
                continue
            if name == "model":
                self.replies.append(from_jsonable(ModelReply, out["reply"]))
                self.tools.append({})
            elif name.startswith("tool:") and self.tools:
                result = from_jsonable(ToolResult, out["result"])
                self.tools[-1][result.call_id] = result


class ReplayStepRunner:
    """Serves the first `upto` model steps (and their tools) from `recorded`, then runs live."""

    def __init__(self, recorded: Recorded, upto: int, live: Any = None) -> None:
        self.recorded = recorded
        self.upto = min(upto, len(recorded.replies))
        self.live = live or DirectStepRunner()
        self.model_steps = 0

    def begin_turn(self, step: int, indices: list[int]) -> None:
        if step > self.upto:
            self.live.begin_turn(step, indices)

    async def model_step(self, step: int, run: Callable[[], Awaitable[ModelReply]]) -> ModelReply:
        self.model_steps += 1
        if self.model_steps <= self.upto:
            return self.recorded.replies[self.model_steps - 1]
        return await self.live.model_step(step, run)

    async def tool_step(self, step: int, index: int, call: ToolCall,
                        run: Callable[[], Awaitable[ToolResult]]) -> ToolResult:
        if step <= self.upto:
            result = self.recorded.tools[step - 1].get(call.id)
            if result is None:
                raise OperationFailed(f"the recorded run has no result for call {call.id} at step {step}")
            return result
        return await self.live.tool_step(step, index, call, run)

    async def wait_approval(self, run_id: str, pending: dict) -> dict | None:
        return await self.live.wait_approval(run_id, pending)

    async def run_child(self, parent_run_id: str, child: ChildRun, run: Callable[[], Awaitable[RunResult]]) -> RunResult:
        return await self.live.run_child(parent_run_id, child, run)


class _AddMessage:
    """The context builder of a fork that adds one user message right before model call N+1."""

    def __init__(self, inner: Any, at: int, text: str | None) -> None:
        self.inner, self.at, self.text, self.calls = inner, at, text, 0

    def build(self, messages: list[Message]) -> list[Message]:
        self.calls += 1
        if self.text is not None and self.calls == self.at + 1:
            messages.append(Message.user(self.text))
        return self.inner.build(messages)


def load(database: str | os.PathLike[str] | None, run_id: str) -> tuple[RunState, Recorded]:
    """A durable run's start state and its recorded steps (read through a DBOS client)."""
    url = engine_url(database).replace("postgresql+psycopg://", "postgresql://", 1)
    client = DBOSClient(system_database_url=url, serializer=DBOSPortableJSONSerializer())
    try:
        found = client.list_workflows(workflow_ids=[run_id], load_input=True)
        if not found:
            raise NotFound(f"no durable run {run_id!r} in {url}")
        inputs: Any = found[0].input
        args = inputs.get("args") if isinstance(inputs, dict) else inputs[0]
        if not args:
            raise NotFound(f"durable run {run_id!r} has no recorded input to fork from")
        job = args[0]
        steps = [dict(s) for s in client.list_workflow_steps(run_id)]
    finally:
        client.destroy()
    return from_jsonable(RunState, job["state"]), Recorded(steps)


async def fork(agent: Any, database: str | os.PathLike[str] | None, run_id: str, step: int, *,
               message: str | None = None, new_run_id: str | None = None) -> RunResult:
    """Run `agent` from step `step` of run `run_id` (in memory): the first `step` model calls are the
    original's, then `message` (if any) and live calls. `result.state` can be continued or stored."""
    start, recorded = load(database, run_id)
    if not 0 <= step <= len(recorded.replies):
        raise InvalidInput(f"run {run_id} has {len(recorded.replies)} model steps; fork at 0..{len(recorded.replies)}")
    new_id = new_run_id or uuid.uuid4().hex[:12]
    state = agent.start_state(None, state=start, run_id=new_id) if start.user == agent.user else None
    if state is None:
        raise InvalidInput(f"run {run_id} belongs to user {start.user!r}, not {agent.user!r}")
    spec = agent._spec(new_id, None, None, False)
    spec.step_runner = ReplayStepRunner(recorded, step)
    spec.context = _AddMessage(spec.context, step, message)
    return await run_loop(spec, state)


def said_by_user(m: Message) -> bool:
    """A user-role message the user wrote (not tether's note on untrusted results after a turn)."""
    return m.role == "user" and not m.content.startswith(NOTE_PREFIX)


def model_turns(messages: list[Message]) -> list[int]:
    """The index of each model call's reply in a stored transcript (call k's reply is the k-th
    assistant message; its input is everything before it)."""
    return [i for i, m in enumerate(messages) if m.role == "assistant"]


def fork_state(state: RunState, step: int, *, run_id: str, message: str | None = None) -> RunState:
    """A new run's state from a stored run's state (its final or parked one), as it stood after model
    call `step` and that call's tools: the transcript up to model call `step + 1`, with `message`
    (if given) in place of its last user message (tether's notes are not the user's). Works for any stored run, durable or not, since it
    needs only the stored messages; nothing is replayed. The safety state is the original's as the
    run left it (its taint, its loop counts), never less than it was at `step`; the fork's usage
    counts its own calls only."""
    turns = model_turns(state.messages)
    if not 0 <= step < len(turns):
        last = len(turns) - 1
        raise InvalidInput(f"run {state.run_id} has {len(turns)} model calls; fork at a step in 0..{last} "
                           "(step N keeps model calls 1..N and runs call N+1 anew)" if last >= 0 else
                           f"run {state.run_id} made no model call to fork from")
    messages = [Message(m.role, m.content, list(m.tool_calls), m.tool_call_id, m.name)
                for m in state.messages[:turns[step]]]
    if message is not None:
        if not message.strip():
            raise InvalidInput("the edited message is empty: write the text the model should see, or leave it out")
        users = [i for i, m in enumerate(messages) if said_by_user(m)]
        if users:
            messages[users[-1]] = Message.user(message)
        else:
            messages.append(Message.user(message))
    return RunState(run_id=run_id, user=state.user, messages=messages, steps=step,
                    loop_counts=dict(state.loop_counts), loop_warned=list(state.loop_warned),
                    policy=state.policy, handles=list(state.handles), task_state=state.task_state,
                    tainted=state.tainted)
