"""Durable runs: checkpoint cost per step on SQLite WAL and on PostgreSQL next to the in-memory
loop, and the crash test, in one run.

    python -m bench.durable        # prints a table, writes bench/durable/results.json

Cost: sequential runs of a scripted model calling one async no-op tool per turn (so each turn is
two DBOS steps, a model step and a tool step); `checkpoint_ms_per_step` = (durable wall time -
in-memory wall time) / DBOS steps, median of repetitions. A second, independent figure: the same
number of bare `INSERT ... COMMIT`s of a step-sized row through sqlite3 in WAL/NORMAL and in the
default rollback journal (what a checkpoint costs the database alone).
Crash: `bench.durable.crash` (50 runs, the worker SIGKILLed at random points, restarted until done).
PostgreSQL is measured when $TETHER_BENCH_POSTGRES or $TETHER_TEST_POSTGRES names a server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tether import Agent, Limits, tool
from tether.models.scripted import ScriptedModel
from tether.tools.executor import AllowAll
from tether.types import ModelReply, ModelRequest, ToolCall

OUT = Path(__file__).with_name("results.json")
TURNS = 20  # tool turns per run (+1 final answer): 41 DBOS steps
RUNS = 8
REPEATS = 3


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return "value-" + key


def _script(request: ModelRequest) -> ModelReply:
    done = sum(1 for m in request.messages if m.role == "tool")
    if done >= TURNS:
        return ModelReply("done")
    return ModelReply("", [ToolCall(f"c{done}", "lookup", {"key": str(done)})])


def _agent(name: str, durable: Any = None) -> Agent:
    return Agent(ScriptedModel(_script), tools=[lookup], policy=AllowAll(), name=name, durable=durable,
                 limits=Limits(max_steps=TURNS + 5, max_repeats=None))


async def _runs(agent: Agent) -> float:
    started = time.perf_counter()
    for _ in range(RUNS):
        result = await agent.arun("go", run_id=uuid.uuid4().hex[:12])
        assert result.completed, result.error
    return time.perf_counter() - started


def measure_memory() -> float:
    agent = _agent("mem")
    asyncio.run(_runs(agent))  # warm up
    return statistics.median(asyncio.run(_runs(agent)) for _ in range(REPEATS))


def measure_durable(database: str) -> float:
    from tether.durable import teardown

    try:
        agent = _agent("bench", durable=database)
        asyncio.run(_runs(agent))  # warm up (launch, first connections)
        return statistics.median(asyncio.run(_runs(agent)) for _ in range(REPEATS))
    finally:
        teardown()


def bare_sqlite_ms(path: Path, journal: str, n: int) -> float:
    """ms per committed step-sized insert through sqlite3 alone."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("PRAGMA synchronous=" + ("NORMAL" if journal == "WAL" else "FULL"))
    conn.execute("CREATE TABLE IF NOT EXISTS steps (wf TEXT, id INTEGER, output TEXT, PRIMARY KEY (wf, id))")
    row = json.dumps({"reply": {"text": "", "tool_calls": [{"id": "c", "name": "lookup", "arguments": {}}]}})
    started = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO steps VALUES (?, ?, ?)", ("w", i, row))
        conn.execute("COMMIT")
    conn.close()
    return (time.perf_counter() - started) * 1000 / n


def _postgres() -> str | None:
    url = os.environ.get("TETHER_BENCH_POSTGRES") or os.environ.get("TETHER_TEST_POSTGRES")
    if not url:
        return None
    import psycopg

    name = f"tether_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rpartition("/")[0] + "/" + name


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.durable.crash import crash_until_done

    steps = RUNS * (2 * TURNS + 1)
    turns = RUNS * (TURNS + 1)
    tmp = Path(tempfile.mkdtemp(prefix="tether-bench-durable-"))
    memory = measure_memory()
    stores: dict[str, dict[str, Any]] = {}
    targets = {"sqlite_wal": str(tmp / "bench.db")}
    pg = _postgres()
    if pg:
        targets["postgres"] = pg
    for name, where in targets.items():
        wall = measure_durable(where)
        stores[name] = {"checkpoint_ms_per_step": round((wall - memory) * 1000 / steps, 3),
                        "durable_ms_per_turn": round(wall * 1000 / turns, 3)}
    n = 2 * TURNS + 1
    bare = {"wal_normal": round(bare_sqlite_ms(tmp / "bare-wal.db", "WAL", n * 4), 3),
            "rollback_full": round(bare_sqlite_ms(tmp / "bare-delete.db", "DELETE", n * 4), 3)}
    for name in targets:
        # a fresh database for each crash test (the worker takes a path or a URL)
        report = crash_until_done(tmp / f"crash-{name}", runs=50, seed=11, max_kills=8,
                                  database=None if name == "sqlite_wal" else _postgres())
        stores[name].update({k: v for k, v in dataclasses.asdict(report).items() if k != "not_completed"})
        stores[name]["not_completed"] = len(report.not_completed)
    results = {
        "in_memory_ms_per_turn": round(memory * 1000 / turns, 4),
        "stores": stores,
        "bare_sqlite_ms_per_commit": bare,
        "workload": {"runs": RUNS, "tool_turns_per_run": TURNS, "dbos_steps": steps, "repeats": REPEATS},
        "bar": {"checkpoint_ms_per_step_sqlite_wal": 3.0},
    }
    print(f"{'store':<12} {'ms/step ckpt':>12} {'ms/turn':>9} {'runs':>5} {'lost':>5} {'dup':>4} "
          f"{'kills':>6} {'taint kept':>10}")
    print(f"{'in-memory':<12} {'-':>12} {results['in_memory_ms_per_turn']:>9.3f}")
    for name, s in stores.items():
        print(f"{name:<12} {s['checkpoint_ms_per_step']:>12.3f} {s['durable_ms_per_turn']:>9.3f} {s['runs']:>5} "
              f"{s['lost_runs']:>5} {s['duplicate_side_effects']:>4} {s['kills']:>6} "
              f"{s['tainted_resume_blocked']:>4}/{s['tainted_killed_before_attack']:<5}")
    print(f"bare sqlite3 commit: WAL/NORMAL {bare['wal_normal']} ms, rollback/FULL {bare['rollback_full']} ms")
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
