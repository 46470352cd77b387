"""Loop overhead, side by side with a 20-line minimal loop, in one run.

    python -m bench.overhead            # prints a table, writes bench/overhead/results.json

Workloads (scripted model, so only framework work is measured):
- sequential: 50 steps of one cheap tool call each, every in-memory guard on (steps, tokens, seconds,
  cost, tool calls, repeated-call detection, result capping, trace); async tool and sync tool (thread pool);
- flatness: per-turn CPU at 10 and at 150 steps;
- big outputs: 20 steps each returning 50 KB; characters the model is sent, memory kept and CPU per
  step (the policy reads every full result: provenance, injection check);
- many tools: 100 registered tools vs 1;
- parallel: 8 tools of 100 ms in one turn (async and sync), wall time of the turn.
CPU is process time, so other load on a shared machine inflates it less than wall time; each figure is
the median of several repetitions.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

# public names only: before_after runs this file against older versions of tether too
from tether import Agent, Limits, ModelReply, ModelRequest, ScriptedModel, Tool, ToolCall, Usage, tool

OUT = Path(__file__).with_name("results.json")
GUARDS = dict(max_tokens=10**12, max_seconds=10**6, max_cost_usd=10**6, max_tool_calls=10**6, max_repeats=3)


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return "value-" + key


@tool
def lookup_sync(key: str) -> str:
    """Look a key up (plain function, runs in the thread pool)."""
    return "value-" + key


def stepping_script(steps: int, tool_name: str, payload: dict[str, Any] | None = None):
    """A model that calls `tool_name` (fresh arguments each turn) `steps` times, then answers."""

    def script(request: ModelRequest) -> ModelReply:
        n = len(request.messages)
        if n >= 2 * steps:
            return ModelReply("done", usage=Usage(10, 5))
        args = {"key": str(n)} if payload is None else {**payload, "key": str(n)}
        return ModelReply("", [ToolCall(f"c{n}", tool_name, args)], Usage(10, 5))

    return script


class BenchModel:
    """A scripted model with no bookkeeping of its own (ScriptedModel copies each request for tests)."""

    name = "bench"
    price = (0.0, 0.0)  # stated, so the cost ceiling of GUARDS may bound it

    def __init__(self, script) -> None:
        self.script = script

    async def complete(self, request: ModelRequest) -> ModelReply:
        return self.script(request)

    def stream(self, request: ModelRequest):  # pragma: no cover - not used by the bench
        raise NotImplementedError


def minimal_loop(steps: int) -> int:
    """The reference: a 20-line loop with no guards at all, same scripted model and tool."""
    tools = {"lookup": lambda key: "value-" + key}
    script = stepping_script(steps, "lookup")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    turns = 0
    while True:
        reply = script(ModelRequest(messages))  # type: ignore[arg-type]
        turns += 1
        messages.append({"role": "assistant", "content": reply.text, "calls": reply.tool_calls})
        if not reply.tool_calls:
            return turns
        for c in reply.tool_calls:
            try:
                out = str(tools[c.name](**c.arguments))
            except Exception as exc:
                out = f"ERROR: {exc}"
            messages.append({"role": "tool", "content": out, "id": c.id})


def cpu_per_turn(fn, turns: int, reps: int = 7) -> float:
    """Median CPU microseconds per turn of `fn()` over `reps` repetitions (after a warm-up)."""
    fn()
    samples = []
    for _ in range(reps):
        gc.collect()
        t = time.process_time()
        fn()
        samples.append((time.process_time() - t) / turns * 1e6)
    return statistics.median(samples)


def tether_runner(steps: int, tools: list[Tool], tool_name: str, payload: dict[str, Any] | None = None):
    agent = Agent(BenchModel(stepping_script(steps, tool_name, payload)), tools=tools,
                  limits=Limits(max_steps=steps + 5, **GUARDS))

    def run_many(n: int = 10):
        async def go():
            for _ in range(n):
                result = await agent.arun("go")
                assert result.completed, result.stop_reason
        asyncio.run(go())

    return agent, run_many


def bench_sequential() -> dict[str, float]:
    steps, reps_in_run = 50, 10
    turns = (steps + 1) * reps_in_run
    _, run_async = tether_runner(steps, [lookup], "lookup")
    _, run_sync = tether_runner(steps, [lookup_sync], "lookup_sync")
    return {
        "minimal_us_per_turn": cpu_per_turn(lambda: [minimal_loop(steps) for _ in range(reps_in_run)], turns),
        "tether_us_per_turn": cpu_per_turn(lambda: run_async(reps_in_run), turns),
        "tether_sync_tool_us_per_turn": cpu_per_turn(lambda: run_sync(reps_in_run), turns),
    }


def bench_telemetry() -> dict[str, float]:
    """us/turn with telemetry off (no observer: the loop does no telemetry work), then on, every span
    kept by OpenTelemetry's in-memory exporter (tether[otel]); None where the SDK is absent."""
    steps, reps_in_run = 50, 10
    turns = (steps + 1) * reps_in_run
    agent, run = tether_runner(steps, [lookup], "lookup")
    off = cpu_per_turn(lambda: run(reps_in_run), turns)
    check = _off_check_us_per_turn(agent, steps)
    try:  # (a tether from before telemetry, in before_after.py, has no tether.telemetry)
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        import tether.telemetry
    except ImportError:
        return {"off_us_per_turn": off, "on_us_per_turn": None, "on_extra_us_per_turn": None, **check}

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tether.telemetry.instrument(provider)
    try:
        on = cpu_per_turn(lambda: run(reps_in_run), turns)
    finally:
        tether.telemetry.uninstrument()
    return {"off_us_per_turn": off, "on_us_per_turn": on, "on_extra_us_per_turn": on - off, **check,
            "off_check_share_of_turn": check["off_check_us_per_turn"] / off}


def _off_check_us_per_turn(agent: Agent, steps: int) -> dict[str, float]:
    """What the OpenTelemetry code path costs when telemetry is off, against the same run without it:
    the loop's only telemetry work then is one test of the empty observer list per event
    (`if OBSERVERS:`, no call). Measured as events per turn x the cost of that test (timeit, net of
    an empty loop), since the test cannot be taken out of a running loop."""
    import timeit

    from tether.events import OBSERVERS

    result = asyncio.run(agent.arun("go"))
    events_per_turn = len(result.trace) / (steps + 1)
    n = 2_000_000
    with_check = min(timeit.repeat("if observers: pass", globals={"observers": OBSERVERS}, number=n, repeat=5))
    empty = min(timeit.repeat("pass", number=n, repeat=5))
    per_check_us = max(0.0, with_check - empty) / n * 1e6
    return {"events_per_turn": events_per_turn, "off_check_us_per_turn": events_per_turn * per_check_us}


def bench_flatness() -> dict[str, float]:
    out = {}
    for steps in (10, 150):
        reps_in_run = max(1, 1500 // steps)
        _, run = tether_runner(steps, [lookup], "lookup")
        out[f"us_per_turn_{steps}_steps"] = cpu_per_turn(lambda run=run, n=reps_in_run: run(n), (steps + 1) * reps_in_run)
    out["ratio_150_vs_10"] = out["us_per_turn_150_steps"] / out["us_per_turn_10_steps"]
    return out


def bench_big_outputs() -> dict[str, float]:
    steps, size = 20, 50_000

    @tool
    async def dump(key: str) -> str:
        """Return a big document."""
        return (key + "x" * size)[:size]

    # prose-like text (words, numbers, ids), for the CPU figures: a run of "x" is one token to index
    page = " ".join(f"Entry {i}: the server at host-{i % 97}.example.com answered in {i * 7 % 1000} ms, "
                    f"status ok, see ticket T-{i * 13 % 10000}." for i in range(size // 60))[:size]

    @tool(effect="read_only")
    async def read_doc(key: str) -> str:
        """Return a big document (trusted output)."""
        return key + " " + page[: size - len(key) - 1]

    @tool(untrusted_output=True, effect="read_only")
    async def read_web(key: str) -> str:
        """Return a big web page (untrusted: the run is tainted, its provenance keeps the decoded text)."""
        return key + " " + page[: size - len(key) - 1]

    def cpu_per_step(t: Tool) -> float:
        """CPU ms per step: capping, the policy's provenance and injection checks over each 50 KB result."""
        agent = Agent(BenchModel(stepping_script(steps, t.name)), tools=[t], limits=Limits(max_steps=40, **GUARDS))
        asyncio.run(agent.arun("go"))
        samples = []
        for _ in range(3):
            started = time.process_time()
            result = asyncio.run(agent.arun("go"))
            assert result.completed and result.usage.tool_calls >= steps // 2, result.stop_reason
            samples.append((time.process_time() - started) / result.steps * 1e3)
        return statistics.median(samples)

    agent = Agent(BenchModel(stepping_script(steps, "dump")), tools=[dump], limits=Limits(max_steps=40, **GUARDS))
    held: list[int] = []

    def on_event(event) -> None:
        if event.kind == "tool_call":
            held.append(tracemalloc.get_traced_memory()[0])

    tracemalloc.start()
    result = asyncio.run(agent.arun("go", on_event=on_event))
    tracemalloc.stop()
    sent = [len(m.content) for m in result.messages if m.role == "tool"]
    half = len(held) // 2
    per_step_late = (held[-1] - held[half]) / (len(held) - 1 - half)
    anchor = []  # what an uncapped loop keeps: every full result in the transcript
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(steps):
        anchor.append(("x" * size) + str(i))
    anchor_per_step = (tracemalloc.get_traced_memory()[0] - base) / steps
    tracemalloc.stop()
    return {
        "tool_output_chars": size,
        "max_chars_sent_per_result": max(sent),
        "uncapped_chars_sent_per_result": size,
        "kept_bytes_per_step_late": per_step_late,
        "uncapped_kept_bytes_per_step": anchor_per_step,
        "cpu_ms_per_step_trusted": cpu_per_step(read_doc),
        "cpu_ms_per_step_untrusted": cpu_per_step(read_web),
    }


def bench_many_tools() -> dict[str, float]:
    many: list[Tool] = [lookup]
    for i in range(99):
        async def f(key: str, i: int = i) -> str:
            return str(i)
        f.__name__ = f"tool_{i}"
        f.__doc__ = f"Tool number {i}."
        many.append(tool(f))
    steps, reps_in_run = 50, 10
    _, run_one = tether_runner(steps, [lookup], "lookup")
    _, run_many = tether_runner(steps, many, "lookup")
    one = cpu_per_turn(lambda: run_one(reps_in_run), (steps + 1) * reps_in_run)
    hundred = cpu_per_turn(lambda: run_many(reps_in_run), (steps + 1) * reps_in_run)
    return {"us_per_turn_1_tool": one, "us_per_turn_100_tools": hundred, "ratio": hundred / one}


def bench_parallel() -> dict[str, float]:
    @tool
    async def wait_async(key: str) -> str:
        """Wait 100 ms."""
        await asyncio.sleep(0.1)
        return key

    @tool
    def wait_sync(key: str) -> str:
        """Wait 100 ms in a thread."""
        time.sleep(0.1)
        return key

    out = {}
    for name, t in (("async", wait_async), ("sync", wait_sync)):
        calls = [ToolCall(f"c{i}", t.name, {"key": str(i)}) for i in range(8)]
        samples = []
        for _ in range(5):
            agent = Agent(ScriptedModel([ModelReply("", calls), "done"]), tools=[t])
            result = asyncio.run(agent.arun("go"))
            turn = next(e for e in result.trace if e.kind == "model_call")
            tool_events = [e for e in result.trace if e.kind == "tool_call"]
            start = turn.t  # events are stamped when they end
            end = max(e.t for e in tool_events)
            samples.append((end - start) * 1000)
        out[f"{name}_turn_ms"] = statistics.median(samples)
    return out


def main() -> int:
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "sequential": bench_sequential(),
        "flatness": bench_flatness(),
        "big_outputs": bench_big_outputs(),
        "many_tools": bench_many_tools(),
        "parallel": bench_parallel(),
        "telemetry": bench_telemetry(),
    }
    seq, flat, big, many, par = (results[k] for k in ("sequential", "flatness", "big_outputs", "many_tools", "parallel"))
    results["bars"] = {
        "us_per_turn_le_50": seq["tether_us_per_turn"] <= 50,
        "flat_10_to_150_le_1.3x": flat["ratio_150_vs_10"] <= 1.3,
        "big_outputs_capped": big["max_chars_sent_per_result"] <= 4_200,
        "parallel_turn_le_120ms": par["async_turn_ms"] <= 120 and par["sync_turn_ms"] <= 120,
        "telemetry_off_within_2pct": results["telemetry"]["off_check_us_per_turn"]
        <= 0.02 * results["telemetry"]["off_us_per_turn"],
    }
    rows = [
        ("minimal 20-line loop, CPU us/turn", seq["minimal_us_per_turn"]),
        ("tether, all guards, async tool, CPU us/turn", seq["tether_us_per_turn"]),
        ("tether, all guards, sync tool (threads), CPU us/turn", seq["tether_sync_tool_us_per_turn"]),
        ("tether / minimal (async tool)", seq["tether_us_per_turn"] / seq["minimal_us_per_turn"]),
        ("us/turn at 10 steps", flat["us_per_turn_10_steps"]),
        ("us/turn at 150 steps", flat["us_per_turn_150_steps"]),
        ("150 / 10 steps", flat["ratio_150_vs_10"]),
        ("50 KB outputs: max chars sent per result", big["max_chars_sent_per_result"]),
        ("50 KB outputs: bytes kept per step (late)", big["kept_bytes_per_step_late"]),
        ("uncapped anchor: bytes kept per step", big["uncapped_kept_bytes_per_step"]),
        ("50 KB outputs: CPU ms per step (trusted)", big["cpu_ms_per_step_trusted"]),
        ("50 KB outputs: CPU ms per step (untrusted)", big["cpu_ms_per_step_untrusted"]),
        ("100 tools vs 1 tool, us/turn ratio", many["ratio"]),
        ("8 x 100 ms async tools, turn ms", par["async_turn_ms"]),
        ("8 x 100 ms sync tools, turn ms", par["sync_turn_ms"]),
        ("telemetry off, CPU us/turn", results["telemetry"]["off_us_per_turn"]),
        ("telemetry on (in-memory spans), CPU us/turn", results["telemetry"]["on_us_per_turn"] or float("nan")),
        ("telemetry off: its one check per event, us/turn", results["telemetry"]["off_check_us_per_turn"]),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value:>12,.2f}")
    for bar, ok in results["bars"].items():
        print(f"bar {bar}: {'PASS' if ok else 'FAIL'}")
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
