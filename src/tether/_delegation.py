"""An agent as a tool of another agent (`Agent.as_tool`), with every limit intact.

Each call is one whole run of the child agent on the task the parent's model wrote:
- its token and cost budgets are carved from what the parent run has left (a share, reserved while
  it runs so siblings never spend the same tokens), its time from the parent's remaining time, its
  steps from its own limits; what it used is charged to the parent;
- it acts as the parent run's user, and each of its calls must also be within the capabilities of
  every run above it (tool permitted, ceilings, the user's authorization): it never gains one a run
  above it lacks; the tool is declared with the strongest effect among the child's tools, so the
  parent's policy gates the call as it would the child's riskiest tool;
- its answer is untrusted in the parent exactly when the child's run read untrusted data
  (`untrusted_answer`);
- a task written after the parent read untrusted data starts the child as tainted (the task is a
  `delegated` message, counted as untrusted input by the child's policy);
- a child that stops for a person's approval parks in the parent's state (`RunState.children`): the
  parent's call is answered as awaiting approval, the parent stops with the child's calls in its
  pending list ("PARENT_CALL/CHILD_CALL"), and a decision there continues the child exactly where it
  stopped when the parent resumes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from tether._errors import AwaitingApproval, InvalidInput, TetherError
from tether._limits import Budget
from tether._loop import DELEGATED_NAME, ChildRun, run_loop
from tether._types import Effect, Message, RunResult, RunState, StopReason, Usage, from_jsonable, to_jsonable
from tether.models._pricing import require_prices
from tether.tools._base import Tool, ToolContext
from tether.tools._declares import Declares
from tether.tools._executor import Bound
from tether.tools._results import ToolOutput

if TYPE_CHECKING:
    from tether._agent import Agent

_EFFECT_ORDER = [Effect.READ_ONLY, Effect.REVERSIBLE, Effect.IRREVERSIBLE]
MIN_CHILD_TOKENS = 200  # below this a child could not write one tool call and an answer
AGENT_KEY = "tether/sub_agent"  # Tool.metadata: the Agent an agent tool runs (a durable child is found by it)


class SubagentError(TetherError, RuntimeError):
    """A child run that did not complete; the message says why and carries its partial answer."""


def agent_as_tool(agent: Agent[Any], name: str, description: str = "", *, share: float = 0.5) -> Tool:
    if not 0 < share <= 1:
        raise InvalidInput(f"share must be in (0, 1], got {share}")

    async def run(task: str, context: ToolContext) -> str | ToolOutput:
        parent = context.run.parent  # None outside a run (an executor driven by hand)
        run_id = f"{context.idempotency_key or context.run_id}.{name}"  # under its parent: run:step:index
        offer = context.run.budget_offer if parent is None else None
        parked = parent.children.pop(context.call_id, None) if parent is not None else None
        resumed = from_jsonable(RunState, parked["state"]) if parked is not None else None
        segment = int(parked.get("segment", 0)) + 1 if parked is not None else 0
        result = await run_carved(agent, task, name=name, budget=parent.budget if parent else None, share=share,
                                  carved=offer, user=context.user, run_id=run_id,
                                  tainted=(parent is not None and parent.tainted()) or context.untrusted_args,
                                  state=resumed,
                                  runner=parent.run_child if parent is not None else None, segment=segment,
                                  bounds=parent.bounds if parent is not None else ())
        sink = context.run.usage_sink
        if sink is not None:  # over MCP (no parent here, so never a parked child)
            sink.add(result.usage)
        if result.stop_reason is StopReason.COMPLETED:
            return ToolOutput(result.answer, untrusted=untrusted_answer(agent, result))
        if result.stop_reason is StopReason.AWAITING_APPROVAL and parent is not None and result.state is not None \
                and result.pending:
            asked = "; ".join(f"{p.get('tool')}({json.dumps(p.get('arguments'), ensure_ascii=False)})"
                              for p in result.pending)
            raise AwaitingApproval(f"the sub-agent '{name}' waits for a person to approve {asked}",
                                   parked={"agent": name, "state": to_jsonable(result.state), "segment": segment})
        raise SubagentError(stopped(name, result))

    return task_tool(name, description or f"Runs the agent '{name}' on a task and returns its final answer.",
                     run, agent.tools, untrusted=may_read_untrusted(agent.tools),
                     metadata={"agent": name, AGENT_KEY: agent})


def task_tool(name: str, description: str, run: Callable[..., Awaitable[Any]], tools: Sequence[Tool], *,
              untrusted: bool, metadata: dict[str, Any]) -> Tool:
    """A tool that hands a task to a worker with `tools` (an agent, a plan-mode run): declared with the
    strongest effect among them, so the caller's policy gates it as it would the riskiest; `untrusted`
    covers its errors (its answers say exactly, `ToolOutput` with `exact_provenance`); no timeout of
    its own (the worker's limits, carved from the caller's, bound it)."""
    effects = [t.effect for t in tools] or [Effect.READ_ONLY]
    return Tool.from_schema(
        name, description,
        {"properties": {"task": {"type": "string", "description": "The task, in full: the worker sees nothing else."}},
         "required": ["task"]},
        run, effect=max(effects, key=_EFFECT_ORDER.index), untrusted_output=untrusted, timeout=None,
        metadata=metadata, declares=Declares(exact_provenance=True), context_param="context")


def may_read_untrusted(tools: Sequence[Tool]) -> bool:
    """Whether any of these tools is declared to return untrusted content."""
    return any(t.untrusted_output or t.declared.source for t in tools)


def untrusted_answer(agent: Agent[Any], result: RunResult) -> bool:
    """Whether a child run's answer carries untrusted data: the run's own taint as it ended when its
    policy keeps one, else (`AllowAll`) whether any of its tools can read untrusted data."""
    if result.state is not None and result.state.policy is not None:
        return result.tainted
    return may_read_untrusted(agent.tools)


def stopped(name: str, result: RunResult) -> str:
    """One line on a child run that did not complete, with its partial answer."""
    partial = f" Partial answer: {result.answer}" if result.answer.strip() else ""
    why = result.stop_reason.value + (f": {result.error}" if result.error else "")
    return f"the sub-agent '{name}' stopped ({why}) after {result.steps} steps.{partial}"


async def run_carved(agent: Agent, task: str, *, name: str, budget: Budget | None, share: float = 0.5,
                     carved: tuple[int | None, float | None] | None = None, user: str | None,
                     run_id: str, tainted: bool, state: RunState | None = None,
                     runner: Callable[[ChildRun, Callable[[], Awaitable[RunResult]]], Awaitable[RunResult]] | None = None,
                     segment: int = 0, bounds: tuple[Bound, ...] = ()) -> RunResult:
    """One child run within `budget`: its token and cost limits are `carved` (already reserved) or
    `share` of what is left, its time what the budget has left; its usage is charged to `budget`.
    `state`: a parked child run to continue (what it used before was charged then; its limits are
    what it used plus the new carve), its `segment`-th. `runner`: the parent's way of running a child
    (`ParentRun.run_child`; a durable parent checkpoints the child step by step); None runs it here.
    `bounds`: the capabilities of the runs above it, which each of its calls must also be within.
    Raises SubagentError when too little is left to start it."""
    tokens, cost = carved if carved is not None else budget.carve(share) if budget is not None else (None, None)
    before = state.usage.copy() if state is not None else Usage()
    try:
        limits = dataclasses.replace(agent.limits)
        if tokens is not None:
            if tokens < MIN_CHILD_TOKENS:
                raise SubagentError(f"not enough of the run's token budget is left for '{name}' "
                                    f"({tokens} tokens); answer with what you have")
            limits.max_tokens = before.total_tokens + min(limits.max_tokens or tokens, tokens)
        if cost is not None:
            if cost <= 0:
                raise SubagentError(f"none of the run's cost budget is left for '{name}'")
            require_prices(agent.model, agent.pricing)  # raises UnpricedModel, before the child starts
            limits.max_cost_usd = before.cost_usd + min(limits.max_cost_usd or cost, cost)
        if budget is not None and (left := budget.remaining_seconds()) is not None:
            limits.max_seconds = before.seconds + min(limits.max_seconds or left, left)
        child = ChildRun(name, task, state or _first_state(agent, task, user, run_id, tainted), limits, segment)
        spec = dataclasses.replace(agent._spec(run_id, None, None, False), limits=limits, user=user, bounds=bounds)
        # a parked child, its decisions taken, runs those calls, then goes on
        result = await (runner(child, lambda: run_loop(spec, child.state)) if runner is not None
                        else run_loop(spec, child.state))
    except BaseException:
        if budget is not None:
            budget.settle(tokens, cost, Usage())
        raise
    if budget is not None:
        budget.settle(tokens, cost, result.usage.minus(before))
    return result


def require_agent_prices(agent: Agent[Any], *, ceiling: bool = False) -> None:
    """Under a cost ceiling (the agent's own, or `ceiling`: one above it), every model the agent or
    any sub-agent below it may call needs a price; raises UnpricedModel naming the first without."""
    ceiling = ceiling or agent.limits.max_cost_usd is not None
    if not ceiling:
        return
    require_prices(agent.model, agent.pricing)
    for tool in agent.tools:
        child = tool.metadata.get(AGENT_KEY)
        if child is not None and child is not agent:
            require_agent_prices(child, ceiling=True)


def _first_state(agent: Agent, task: str, user: str | None, run_id: str, tainted: bool) -> RunState:
    messages = [Message.system(agent.instructions)] if agent.instructions else []
    messages.append(Message("user", task, name=DELEGATED_NAME if tainted else None))
    return RunState(run_id=run_id, user=user, messages=messages)
