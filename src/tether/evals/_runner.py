"""Run a suite's scenarios (concurrently, within a limit) and collect one report.

Where each scenario's model comes from:
- `replay` (default): its cassette, with the recorded tool responses; a scenario without a cassette
  runs its script. Requests or tool calls the cassette lacks are reported as drift, by name.
- `record`: its script (or the live `model`) runs with the real tools and the cassette is written.
- `live`: the given `model` with the real tools.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from tether._types import ModelReply, ModelRequest, TextDelta, Usage
from tether.evals._cassette import Cassette, CassettePlayer, CassetteRecorder
from tether.evals._checks import failures, measure
from tether.evals._suite import Scenario, Suite, SuiteError
from tether.models._base import Model, stream_by_completing
from tether.models._scripted import ScriptedModel
from tether.policy import OracleApprover
from tether.tools._base import Tool

Mode = Literal["replay", "record", "live"]
TOTALS = ("steps", "input_tokens", "output_tokens", "cost_usd", "tool_calls", "side_effect_requests",
          "unnecessary_side_effect_requests", "approvals_requested", "safety_violations")


async def run_suite(suite: Suite, *, mode: Mode = "replay", model: Model | None = None, judge: Model | None = None,
                    concurrency: int | None = None, only: list[str] | None = None,
                    on_done: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the suite; returns the report (scenarios in suite order, then totals)."""
    if mode == "live" and model is None:
        raise SuiteError("live mode needs a model (--model)")
    scenarios = [s for s in suite.scenarios if not only or s.id in only]
    if only and len(scenarios) != len(set(only)):
        missing = sorted(set(only) - {s.id for s in scenarios})
        raise SuiteError(f"no scenario named {', '.join(missing)} in {suite.path}")
    limit = asyncio.Semaphore(max(1, concurrency or suite.concurrency))

    async def bounded(sc: Scenario) -> dict[str, Any]:
        async with limit:
            row = await run_scenario(suite, sc, mode=mode, model=model, judge=judge)
        if on_done is not None:
            on_done(row)
        return row

    rows = await asyncio.gather(*(bounded(s) for s in scenarios))
    totals: dict[str, Any] = {k: round(sum(r[k] for r in rows), 6) for k in TOTALS}
    totals["scenarios"] = len(rows)
    totals["passed"] = sum(1 for r in rows if r["success"])
    totals["drifted"] = sum(1 for r in rows if r["drift"])
    return {"suite": suite.name, "mode": mode, "model": getattr(model, "name", None), "scenarios": rows,
            "totals": totals}


class EstimatedUsage:
    """Gives a scripted model's replies token counts (about 4 characters a token) so a suite's token
    and cost columns mean something before a live model is recorded."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.name = inner.name

    async def complete(self, request: ModelRequest) -> ModelReply:
        out = await self.inner.complete(request)
        if out.usage.total_tokens == 0:
            sent = sum(len(m.content) + sum(len(json.dumps(c.arguments)) for c in m.tool_calls)
                       for m in request.messages)
            sent += sum(len(t.description) + len(json.dumps(t.parameters)) for t in request.tools)
            made = len(out.text) + sum(len(c.name) + len(json.dumps(c.arguments)) for c in out.tool_calls)
            out.usage = Usage(input_tokens=sent // 4 + 1, output_tokens=made // 4 + 1)
        return out

    def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
        return stream_by_completing(self, request)


async def run_scenario(suite: Suite, sc: Scenario, *, mode: Mode = "replay", model: Model | None = None,
                       judge: Model | None = None) -> dict[str, Any]:
    """One scenario, start to report row. Never raises for a scenario's own failure."""
    started = time.monotonic()
    path = suite.cassette_path(sc)
    player: CassettePlayer | None = None
    recorder: CassetteRecorder | None = None
    wrap: Callable[[list[Tool]], list[Tool]] = list
    if mode == "live":
        run_model, source = model, "live"
    elif mode == "replay" and path is not None and path.exists():
        player = CassettePlayer(Cassette.load(path))
        run_model, source, wrap = player.model, "cassette", player.wrap_tools
    elif sc.script or model is not None:
        run_model = model if model is not None else EstimatedUsage(ScriptedModel(sc.script_items(), name="scripted"))
        source = "script" if model is None else "live"
    else:
        raise SuiteError(f"scenario {sc.id!r} has no cassette ({path}) and no script; record it or pass --model")
    if mode == "record":
        recorder = CassetteRecorder(run_model)
        run_model, wrap = recorder, recorder.wrap_tools
    approver = OracleApprover([(a["tool"], a.get("arguments", {})) for a in sc.approve])
    agent = suite.factory(run_model, user=sc.user, approver=approver, limits=sc.run_limits(None), wrap_tools=wrap)
    result = await agent.arun(sc.prompt, run_id=f"eval-{sc.id}")
    effects = {name: t.effect for name, t in agent.executor.tools.items()}
    m = measure(sc, result, effects, len(approver.asked))
    failed = await failures(sc, result, agent, m, suite.path.parent, judge)
    drift = list(player.drift) if player is not None else []
    failed += [f"drift: {d}" for d in drift]
    if recorder is not None and path is not None:
        recorder.cassette.save(path)
    return {"id": sc.id, "source": source, "success": not failed, "failures": failed, "drift": drift, **m,
            "answer": (result.answer or "")[:400], "seconds": round(time.monotonic() - started, 3)}
