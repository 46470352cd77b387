"""Several agents under one budget: orchestrator-worker and pipeline.

Most tasks want one agent with good tools (and `agent.as_tool` when a sub-task needs its own context
or a permission boundary). These two shapes are for the rest:

    result = await orchestrate("Compare X and Y", planner=planner, worker=worker, synthesizer=writer,
                               limits=Limits(max_tokens=60_000))
    result = await pipeline([Stage("extract", extractor, Facts), Stage("draft", writer)], text,
                            limits=Limits(max_cost_usd=0.05))

Every child run's token and cost budget is carved from the team's (`Budget.carve`), its usage charged
back, so the team's totals never exceed its limits; each child acts as `user`; a worker that read
untrusted data makes the synthesis's input untrusted too.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from tether._agent import Agent
from tether._delegation import SubagentError, run_carved, stopped, untrusted_answer
from tether._limits import Budget, Limits, MonotonicClock
from tether._types import RunResult, StopReason, Usage


class SubQuestions(BaseModel):
    """The planner's output: independent sub-questions, each answerable on its own."""

    questions: list[str] = Field(min_length=1, max_length=8)


@dataclass(slots=True)
class WorkerReport:
    id: str  # "W1": how the synthesis cites it
    question: str
    ok: bool
    answer: str
    error: str | None = None
    usage: Usage = field(default_factory=Usage)


@dataclass(slots=True)
class TeamResult:
    answer: str
    stop_reason: StopReason
    plan: list[str] = field(default_factory=list)
    workers: list[WorkerReport] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    bad_citations: list[str] = field(default_factory=list)  # cited workers that do not exist or failed
    contradictions: list[str] = field(default_factory=list)  # as the synthesis flagged them

    @property
    def completed(self) -> bool:
        return self.stop_reason is StopReason.COMPLETED

    @property
    def failed_workers(self) -> list[WorkerReport]:
        return [w for w in self.workers if not w.ok]


PLAN_PROMPT = (
    "Split this question into at most {n} independent sub-questions, each answerable on its own by a "
    "researcher who sees only that sub-question. Question: {question}"
)
SYNTHESIS_PROMPT = (
    "Question: {question}\n\nResearchers answered these sub-questions:\n\n{findings}\n\n"
    "Write the answer. Cite the researcher behind every claim as [W1], [W2], ... Say which researchers "
    "failed and what is therefore missing. If two researchers disagree, start a line with "
    "'CONTRADICTION:' naming both and what they disagree on."
)
_CITE = re.compile(r"\[W(\d+)\]")


async def orchestrate(question: str, *, planner: Agent[Any], worker: Agent[Any], synthesizer: Agent[Any],
                      limits: Limits | None = None, max_workers: int = 4, user: str | None = None,
                      synthesis_share: float = 0.3) -> TeamResult:
    """Plan sub-questions (typed), run workers concurrently with equal, strict budgets, then one
    synthesis that sees every finding and every failure. `limits` bounds the whole team."""
    limits = limits or Limits()
    budget = Budget(limits, MonotonicClock())
    team = uuid.uuid4().hex[:8]
    out = TeamResult(answer="", stop_reason=StopReason.ERROR)

    # 1. The plan, a typed value (the planner is asked with SubQuestions as its output type).
    try:
        planned = await run_carved(_typed(planner, SubQuestions), PLAN_PROMPT.format(n=max_workers, question=question),
                                   name="planner", budget=budget, share=0.2, user=user, run_id=f"team-{team}.plan",
                                   tainted=False)
    except SubagentError as exc:
        return _done(out, budget, StopReason.TOKEN_BUDGET, str(exc))
    if not isinstance(planned.output, SubQuestions):
        return _done(out, budget, planned.stop_reason, "the plan did not validate: " + stopped("planner", planned))
    out.plan = planned.output.questions[:max_workers]
    # sub-questions written after the planner read untrusted data are not the user's
    briefs_tainted = untrusted_answer(planner, planned)
    read: list[bool] = []  # per finished worker: its answer carries untrusted data

    # 2. Workers, each with an equal share of what is left after the synthesis's reserve.
    held = budget.carve(synthesis_share)
    shares = [budget.carve(1 / (len(out.plan) - i)) for i in range(len(out.plan))]

    async def work(i: int, q: str, carved: tuple[int | None, float | None]) -> WorkerReport:
        wid = f"W{i + 1}"
        try:
            r = await run_carved(worker, q, name=wid, budget=budget, carved=carved, user=user,
                                 run_id=f"team-{team}.{wid}", tainted=briefs_tainted)
        except SubagentError as exc:
            return WorkerReport(wid, q, False, "", str(exc))
        read.append(briefs_tainted or untrusted_answer(worker, r))
        if r.completed:
            return WorkerReport(wid, q, True, r.answer, None, r.usage)
        return WorkerReport(wid, q, False, r.answer, stopped(wid, r), r.usage)

    out.workers = list(await asyncio.gather(*(work(i, q, c) for i, (q, c) in enumerate(zip(out.plan, shares,
                                                                                              strict=True)))))

    # 3. One synthesis over every finding; failed workers are shown as failures, not left out.
    budget.settle(*held, Usage())
    findings = "\n\n".join(
        f"[{w.id}] {w.question}\n" + (w.answer if w.ok else f"FAILED: {w.error}") for w in out.workers)
    try:
        synth = await run_carved(synthesizer, SYNTHESIS_PROMPT.format(question=question, findings=findings),
                                 name="synthesis", budget=budget, share=1.0, user=user,
                                 run_id=f"team-{team}.synthesis", tainted=any(read))
    except SubagentError as exc:
        return _done(out, budget, StopReason.TOKEN_BUDGET, str(exc))
    out.answer = synth.answer
    ok_ids = {w.id for w in out.workers if w.ok}
    out.bad_citations = sorted({f"W{n}" for n in _CITE.findall(synth.answer)} - ok_ids)
    out.contradictions = [ln.split(":", 1)[1].strip() for ln in synth.answer.splitlines()
                          if ln.strip().upper().startswith("CONTRADICTION:")]
    return _done(out, budget, synth.stop_reason, synth.error)


@dataclass(slots=True)
class Stage:
    """One specialist of a pipeline; `input_type` validates what it is handed (the previous stage's
    output), so a stage never works on malformed input."""

    name: str
    agent: Agent[Any]
    input_type: Any = None


@dataclass(slots=True)
class PipelineResult:
    output: Any
    stop_reason: StopReason
    stages: list[tuple[str, RunResult[Any]]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.stop_reason is StopReason.COMPLETED


async def pipeline(stages: Sequence[Stage], value: Any, *, limits: Limits | None = None,
                   user: str | None = None) -> PipelineResult:
    """Run `stages` in order, each on the previous one's output (JSON when typed), each with an equal
    share of what is left of `limits`; stop at the first stage that fails or gets invalid input."""
    budget = Budget(limits or Limits(), MonotonicClock())
    run = uuid.uuid4().hex[:8]
    out = PipelineResult(output=value, stop_reason=StopReason.COMPLETED)
    tainted = False  # an earlier stage read untrusted data: what it handed on is not the user's
    for i, stage in enumerate(stages):
        if stage.input_type is not None:
            try:
                value = TypeAdapter(stage.input_type).validate_python(value)
            except ValidationError as exc:
                out.stop_reason, out.error = StopReason.OUTPUT_INVALID, \
                    f"stage '{stage.name}' got invalid input: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"
                break
        task = value if isinstance(value, str) else json.dumps(TypeAdapter(Any).dump_python(value, mode="json"))
        try:
            r = await run_carved(stage.agent, task, name=stage.name, budget=budget, share=1 / (len(stages) - i),
                                 user=user, run_id=f"pipe-{run}.{stage.name}", tainted=tainted)
        except SubagentError as exc:
            out.stop_reason, out.error = StopReason.TOKEN_BUDGET, str(exc)
            break
        out.stages.append((stage.name, r))
        if not r.completed:
            out.stop_reason, out.error = r.stop_reason, stopped(stage.name, r)
            break
        value = r.output if r.output is not None else r.answer
        tainted = tainted or untrusted_answer(stage.agent, r)
    out.output = value
    out.usage = budget.finish()
    return out


def _typed(agent: Agent[Any], output_type: type) -> Agent[Any]:
    """The agent with this output type (a copy: the caller's agent is not changed)."""
    if agent.output_type is output_type:
        return agent
    return Agent(agent.model, tools=agent.tools, instructions=agent.instructions, limits=agent.limits,
                 policy=agent.policy, user=agent.user, pricing=agent.pricing, clock=agent.clock,
                 context=agent.context, output_type=output_type, output_retries=agent.output_retries)


def _done(out: TeamResult, budget: Budget, stop: StopReason, error: str | None) -> TeamResult:
    out.stop_reason, out.error = stop, error
    out.usage = budget.finish()
    return out
