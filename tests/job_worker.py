"""A durable run whose job blocks until its process is killed (tests/test_jobs.py): run it, SIGKILL it
once the job has started, run it again; the recovered run must report the job lost, not run it again.

    python tests/job_worker.py DB LEDGER
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from hang import HANG

from tether import Agent, AllowAll, ToolContext, tool
from tether._types import ModelReply, ModelRequest, ToolCall
from tether.models._scripted import ScriptedModel


def build(ledger: Path, durable: object) -> object:
    @tool(job=True, effect="reversible")
    def query_metrics(service: str, ctx: ToolContext) -> str:
        """Query a service's metrics (slow)."""
        with open(ledger, "a", encoding="utf-8") as fh:
            fh.write(f"ran {ctx.idempotency_key}\n")
        ctx.cancel_event.wait(HANG)  # the first process is killed here
        return "p99 250 ms"

    def script(request: ModelRequest) -> ModelReply:
        tools = [m for m in request.messages if m.role == "tool"]
        if not tools:
            return ModelReply(tool_calls=[ToolCall("c1", "query_metrics", {"service": "api"})])
        if tools[-1].name == "query_metrics":
            return ModelReply(text="waiting for the metrics")
        return ModelReply(text=f"answer: {tools[-1].content}")

    return Agent(ScriptedModel(script), tools=[query_metrics], policy=AllowAll(), name="jobs", durable=durable)


async def main(db: str, ledger: Path) -> int:
    from tether.durable import Durable, runtime

    agent = build(ledger, Durable(db))
    runtime().launch()  # recovers the run a killed worker left pending
    result = await agent.arun("api latency?", run_id="jobs1")  # type: ignore[attr-defined]
    print(f"{result.stop_reason.value}: {result.answer}", flush=True)
    return 0 if result.completed else 1


if __name__ == "__main__":
    code = asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
    sys.stdout.flush()
    os._exit(code)  # no DBOS shutdown dance: a next worker recovers anyway
