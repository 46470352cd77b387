"""The bench's agent: three tool calls (each a ledger line keyed by its idempotency key, with the wall
time it finished), one call that needs a person's confirmation, and a final answer streamed in five
pieces, each the wall time it was sent."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tether import Agent, Limits, tool
from tether._types import ModelReply, ModelRequest, TextDelta, ToolCall
from tether.models._scripted import ScriptedModel
from tether.policy import Capabilities, Capability, SafetyPolicy
from tether.tools._base import ToolContext

LEDGER = Path(os.environ.get("TETHER_BENCH_LEDGER", "/tmp/tether-bench-ledger.txt"))


def _write(kind: str, context: ToolContext) -> None:
    with LEDGER.open("a") as fh:  # one short append: atomic enough for the bench's line counts
        fh.write(f"{kind} {context.idempotency_key} {context.call_id} {time.time():.6f}\n")


@tool(effect="reversible")
async def step(n: int, context: ToolContext) -> str:
    """One unit of work.

    Args:
        n: which
    """
    await asyncio.sleep(0.02)
    _write("step", context)
    return f"step {n} done"


@tool(effect="irreversible")
async def commit(context: ToolContext) -> str:
    """Commit the work (needs a person's confirmation)."""
    _write("commit", context)
    return "committed"


def script(request: ModelRequest):
    n = sum(1 for m in request.messages if m.role == "assistant")
    if n < 3:
        return ToolCall(f"s{n}", "step", {"n": n})
    if n == 3:
        return ToolCall("c", "commit", {})
    return "all done"


class TimedText(ScriptedModel):
    """Streams a text reply as five pieces 20 ms apart, each the wall time it was sent (so the client
    can measure how long streamed text takes to reach it)."""

    async def stream(self, request: ModelRequest):  # type: ignore[override]
        out: ModelReply = await self.complete(request)
        if out.tool_calls:
            yield out
            return
        pieces = []
        for _ in range(5):
            await asyncio.sleep(0.02)
            pieces.append(f"{time.time():.6f} ")
            yield TextDelta(pieces[-1])
        out.text = "".join(pieces)
        yield out


def worker(user: str | None) -> Agent:
    caps = Capabilities([Capability("commit", requires_approval=True)], unlisted="inherit")
    return Agent(TimedText(script), tools=[step, commit], policy=SafetyPolicy(capabilities=caps),
                 limits=Limits(max_steps=8))


AGENTS = {"worker": worker}
