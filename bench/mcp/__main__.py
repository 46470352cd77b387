"""What tether adds to an MCP tool call, side by side with the bare SDK client, in one run.

    python -m bench.mcp            # prints a table, writes bench/mcp/results.json

For each of two independent servers over stdio (the npm `server-everything`'s `echo`, node; and the
Python `tests/mcp_servers/flaky_server.py`'s `echo`), the same N sequential calls are timed:
- sdk: `mcp.Client.call_tool` on a session opened with the SDK directly (the floor);
- tether/allow: `Executor.execute` of the tether tool (validation, capping, the hop to the toolset's
  background loop) with the policy off;
- tether/policy: the same under the default `SafetyPolicy` (the tool's output trusted and its hints
  confirmed in the config, so every call is allowed and nothing is wrapped);
- portal hop: the toolset's hop to its background event loop and back, with nothing to do there.
The three setups run at once, on two sessions to the same server command, interleaved call by call
so the load of a shared machine falls on all of them alike. Each figure is the median wall time per
call over N calls after 20 warm-up calls; the ratio is to the sdk figure of the same server.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

from tether._types import ToolCall
from tether.mcp import MCPToolset, parse_config
from tether.policy import SafetyPolicy
from tether.tools._executor import AllowAll, CallContext, Executor

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("results.json")
N, WARMUP = 300, 20
SERVERS = {
    "everything (node)": ([str(ROOT / "tests/mcp_servers/node_modules/.bin/mcp-server-everything")], "message"),
    "flaky (python)": ([sys.executable, str(ROOT / "tests/mcp_servers/flaky_server.py")], "text"),
}


async def measure(argv: list[str], arg: str, toolset: MCPToolset) -> dict[str, list[float]]:
    """The three setups interleaved call by call, so load on the machine falls on all of them alike."""
    executors = {"tether/allow": Executor(toolset.tools, policy=AllowAll()),
                 "tether/policy": Executor(toolset.tools, policy=SafetyPolicy())}
    times: dict[str, list[float]] = {"sdk": [], **{k: [] for k in executors}}
    contexts = {k: CallContext("bench", policy_state=e.policy.start_run("bench", None, [], []))
                for k, e in executors.items()}
    async with Client(StdioServerParameters(command=argv[0], args=argv[1:])) as client:
        for i in range(N + WARMUP):
            t = time.perf_counter()
            raw = await client.call_tool("echo", {arg: f"hello {i}"})
            times["sdk"].append(time.perf_counter() - t)
            assert not raw.is_error
            for setup, executor in executors.items():
                t = time.perf_counter()
                result = await executor.execute(ToolCall(f"c{i}", "s__echo", {arg: f"hello {i}"}),
                                                contexts[setup])
                times[setup].append(time.perf_counter() - t)
                assert not result.is_error, result.content
    for executor in executors.values():
        executor.close()
    return {k: v[WARMUP:] for k, v in times.items()}


async def portal_hop() -> list[float]:
    """The toolset's thread hop alone: an empty coroutine run on its background loop and awaited."""
    from tether.mcp._client import _Portal

    async def nothing() -> None:
        return None

    portal, times = _Portal(), []
    for _ in range(N + WARMUP):
        t = time.perf_counter()
        await portal.arun(nothing())
        times.append(time.perf_counter() - t)
    portal.stop()
    return times[WARMUP:]


def main() -> None:
    rows: list[dict[str, Any]] = []
    for label, (argv, arg) in SERVERS.items():
        if not Path(argv[-1]).exists():
            print(f"skipping {label}: {argv[-1]} is missing (run scripts/bootstrap)", file=sys.stderr)
            continue
        config = {"mcpServers": {"s": {"command": argv[0], "args": argv[1:], "tether": {
            "trustAnnotations": ["echo"], "trustedOutput": ["echo"], "connectTimeout": 60}}}}
        with MCPToolset(parse_config(config)) as toolset:
            assert not toolset.failures, toolset.failures
            medians = {k: statistics.median(v) for k, v in asyncio.run(measure(argv, arg, toolset)).items()}
        for setup, value in medians.items():
            rows.append({"server": label, "setup": setup, "ms_per_call": round(value * 1e3, 3),
                         "ratio_to_sdk": round(value / medians["sdk"], 2), "calls": N})
    hop = statistics.median(asyncio.run(portal_hop()))
    rows.append({"server": "(none)", "setup": "portal hop", "ms_per_call": round(hop * 1e3, 3),
                 "ratio_to_sdk": None, "calls": N})
    print(f"{'server':<20} {'setup':<15} {'ms/call':>9} {'x sdk':>7}")
    for r in rows:
        ratio = "" if r["ratio_to_sdk"] is None else f"{r['ratio_to_sdk']:.2f}"
        print(f"{r['server']:<20} {r['setup']:<15} {r['ms_per_call']:>9.3f} {ratio:>7}")
    OUT.write_text(json.dumps({"calls": N, "warmup": WARMUP, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
