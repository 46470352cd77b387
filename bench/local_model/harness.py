"""Run the offline task suite through tether's Agent loop with a given model and collect figures."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.local_model.tasks import TASKS, Task, Variant, check, make_workspace
from tether.agent import Agent
from tether.limits import Limits
from tether.models.local import CallStats, LocalModel
from tether.tools.base import Tool
from tether.tools.builtin.calculator import calculator
from tether.tools.builtin.files import read_tool
from tether.tools.executor import Executor
from tether.types import ModelReply, ModelRequest, StopReason, TextDelta

LIMITS = Limits(max_steps=6, max_repeats=2)

def instructions(workspace: Path) -> str:
    """The CLI's default instructions, so the suite measures the main job as `tether -p` runs it."""
    try:
        from tether.cli.build import DEFAULT_INSTRUCTIONS
    except ImportError:  # CLI not installed: a neutral stand-in
        return "Answer the user's question with the tools you are given. Reply with the answer only."
    return DEFAULT_INSTRUCTIONS.format(workspace=workspace)


class StatsModel:
    """Wraps a LocalModel and keeps the llama.cpp timing of every call."""

    def __init__(self, inner: LocalModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[CallStats] = []

    async def complete(self, request: ModelRequest) -> ModelReply:
        reply = await self.inner.complete(request)
        self.calls.append(self.inner.last_stats)
        return reply

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        reply = await self.complete(request)
        yield reply


@dataclass
class Outcome:
    prompt: str
    ok: bool
    answer: str
    stop_reason: str
    seconds: float
    steps: int
    tool_calls: list[str] = field(default_factory=list)


@dataclass
class TaskReport:
    name: str
    description: str
    outcomes: list[Outcome]

    @property
    def success_rate(self) -> float:
        return sum(o.ok for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0


def _tools(kind: str, workspace: Path, rag_tools: Callable[[], list[Tool]] | None) -> list[Tool]:
    if kind == "calculator":
        return [calculator]
    if kind == "files":
        return [read_tool(workspace)]
    if kind == "rag" and rag_tools is not None:
        return rag_tools()
    raise ValueError(f"unknown tool set {kind!r}")


def run_variant(model: StatsModel, tools: list[Tool], variant: Variant, workspace: Path) -> Outcome:
    # No read_result tool: every result here fits under the cap, and the 135M model calls an
    # advertised read_result with invented handles instead of reading the file.
    executor = Executor(tools, read_result=False)
    agent = Agent(model, tools=tools, instructions=instructions(workspace), limits=LIMITS, executor=executor)
    start = time.perf_counter()
    result = agent.run(variant.prompt)
    elapsed = time.perf_counter() - start
    calls = [f"{c.name}({c.arguments})" for m in result.messages for c in m.tool_calls]
    ok = result.stop_reason is StopReason.COMPLETED and check(result.answer, variant.expected)
    return Outcome(variant.prompt, ok, result.answer, result.stop_reason.value, elapsed, result.steps, calls)


def run_suite(
    model: LocalModel,
    tasks: tuple[Task, ...] = TASKS,
    *,
    rag_tools: Callable[[], list[Tool]] | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    stats = StatsModel(model)
    model.load()
    reports: list[TaskReport] = []
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        workspace = make_workspace(Path(tmp))
        for task in tasks:
            tools = _tools(task.tools, workspace, rag_tools)
            outcomes = []
            for variant in task.variants:
                outcome = run_variant(stats, tools, variant, workspace)
                outcomes.append(outcome)
                mark = "ok " if outcome.ok else "BAD"
                progress(f"  {mark} {task.name:<15} {outcome.seconds:5.1f}s {outcome.stop_reason:<13} "
                         f"{variant.prompt[:48]!r} -> {outcome.answer[:60]!r} calls={outcome.tool_calls}")
            reports.append(TaskReport(task.name, task.description, outcomes))
    p_tok = sum(c.prompt_eval_tokens for c in stats.calls)
    p_sec = sum(c.prompt_eval_seconds for c in stats.calls)
    g_tok = sum(c.eval_tokens for c in stats.calls)
    g_sec = sum(c.eval_seconds for c in stats.calls)
    return {
        "model": model.name,
        "gguf": model.path.name,
        "n_threads": model.n_threads,
        "temperature": model.temperature,
        "limits": {"max_steps": LIMITS.max_steps, "max_repeats": LIMITS.max_repeats},
        "machine": {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
        "tasks": {
            r.name: {
                "description": r.description,
                "success_rate": round(r.success_rate, 3),
                "seconds": round(r.seconds, 2),
                "variants": len(r.outcomes),
                "successes": sum(o.ok for o in r.outcomes),
                "failures": [
                    {"prompt": o.prompt, "answer": o.answer[:200], "stop_reason": o.stop_reason,
                     "tool_calls": o.tool_calls}
                    for o in r.outcomes if not o.ok
                ],
            }
            for r in reports
        },
        "model_calls": len(stats.calls),
        "prompt_tokens": sum(c.prompt_tokens for c in stats.calls),
        "prompt_tokens_evaluated": p_tok,  # the rest came from llama.cpp's reused KV cache
        "generation_tokens": g_tok,
        "prompt_tokens_per_second": round(p_tok / p_sec, 1) if p_sec else None,
        "generation_tokens_per_second": round(g_tok / g_sec, 1) if g_sec else None,
    }
