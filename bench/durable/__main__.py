"""Durable runs: checkpoint cost per step on SQLite WAL and on PostgreSQL next to the in-memory
loop, and the crash test, in one run.

    python -m bench.durable        # prints a table, writes bench/durable/results.json

Cost: sequential runs of a scripted model calling one async no-op tool per turn (so each turn is
two DBOS steps, a model step and a tool step); `checkpoint_ms_per_step` = (durable wall time -
in-memory wall time) / DBOS steps, median of repetitions; `checkpoint_cpu_ms_per_step` the same
in process CPU time (steadier on a shared machine); `..._stock_dbos` the same with
tether.durable._dbos_fastpath uninstalled (DBOS's own step checkpoints). Two independent figures:
`noop_dbos_step_ms`, ms per step of a bare DBOS workflow of 200 no-op async steps (DBOS alone, with
and without the fast path, no subtraction); and the same number of bare `INSERT ... COMMIT`s of a
step-sized row through sqlite3 in WAL/NORMAL and in the default rollback journal (what a checkpoint
costs the database alone).
Crash: `bench.durable.crash` (50 runs, the worker SIGKILLed and restarted until done: odd kills at
random points drawn from 0.1-1x the time the same workload takes unkilled on this machine, even ones
aimed at a tainted run between reading the injection and trying the attack).
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

from dbos import DBOS

# public names only: before_after runs this file against older versions of tether too
from tether import Agent, Limits, ModelReply, ModelRequest, ScriptedModel, ToolCall, tool

try:
    from tether import AllowAll
except ImportError:  # a tether before AllowAll was exported (before_after's base)
    from tether.tools.executor import AllowAll  # type: ignore[no-redef]

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


def _timed(agent: Agent) -> tuple[float, float]:
    """(wall, CPU) seconds of one batch of runs."""
    cpu = time.process_time()
    wall = asyncio.run(_runs(agent))
    return wall, time.process_time() - cpu


def _medians(agent: Agent) -> tuple[float, float]:
    _timed(agent)  # warm up (durable: launch, first connections)
    samples = [_timed(agent) for _ in range(REPEATS)]
    return statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)


def measure_memory() -> float:
    """Median wall seconds of the batch in memory (bench/service uses it too)."""
    return time_memory()[0]


def measure_durable(database: str) -> float:
    """Median wall seconds of the batch as durable runs on `database`."""
    return time_durable(database)[0]


def time_memory() -> tuple[float, float]:
    """Median (wall, CPU) seconds of the batch in memory."""
    return _medians(_agent("mem"))


def time_durable(database: str, *, fastpath: bool = True) -> tuple[float, float]:
    """Median (wall, CPU) seconds of the batch as durable runs; `fastpath=False`: stock DBOS."""
    from tether.durable import Durable, teardown
    from tether.durable import _dbos_fastpath as dbos_fastpath

    try:
        agent = _agent("bench", durable=Durable(database, fastpath=fastpath))
        return _medians(agent)
    finally:
        teardown()
        dbos_fastpath.uninstall()


@DBOS.workflow(name="bench.noop_steps")
async def _noop_steps(n: int) -> int:
    async def noop() -> int:
        return 1

    for _ in range(n):
        await DBOS.run_step_async({"name": "noop"}, noop)
    return n


def bare_dbos_step_ms(database: str, *, fastpath: bool = True, steps: int = 200) -> float:
    """ms per step of a DBOS workflow of `steps` no-op async steps, median of repetitions: DBOS's own
    step cost with nothing of tether in it (a second figure, not a difference of two timings)."""
    from tether.durable import Durable, runtime, setup, teardown
    from tether.durable import _dbos_fastpath as dbos_fastpath

    async def once() -> float:
        runtime().launch()
        started = time.perf_counter()
        handle = await DBOS.start_workflow_async(_noop_steps, steps)
        assert await handle.get_result() == steps
        return time.perf_counter() - started

    try:
        setup(Durable(database, fastpath=fastpath))
        samples = [asyncio.run(once()) for _ in range(REPEATS + 1)][1:]  # the first launches DBOS
    finally:
        teardown()
        dbos_fastpath.uninstall()
    return statistics.median(samples) * 1000 / steps


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


_CREATED: list[str] = []  # the databases `_postgres` made, dropped by `drop_postgres_databases`


def _server() -> str | None:
    return os.environ.get("TETHER_BENCH_POSTGRES") or os.environ.get("TETHER_TEST_POSTGRES")


def _postgres() -> str | None:
    """A fresh PostgreSQL database on the server $TETHER_BENCH_POSTGRES (or $TETHER_TEST_POSTGRES) names."""
    url = _server()
    if not url:
        return None
    import psycopg

    name = f"tether_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _CREATED.append(name)
    return url.rpartition("/")[0] + "/" + name


def drop_postgres_databases() -> None:
    """Drop the databases this bench made (at its end: nothing may still use them)."""
    url = _server()
    if not url or not _CREATED:
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while _CREATED:
            conn.execute(f'DROP DATABASE IF EXISTS "{_CREATED.pop()}" WITH (FORCE)')


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.durable.crash import crash_until_done, kill_window

    steps = RUNS * (2 * TURNS + 1)
    turns = RUNS * (TURNS + 1)
    tmp = Path(tempfile.mkdtemp(prefix="tether-bench-durable-"))
    memory, memory_cpu = time_memory()
    stores: dict[str, dict[str, Any]] = {}
    targets = {"sqlite_wal": (str(tmp / "bench.db"), str(tmp / "bench-stock.db"))}
    if os.environ.get("TETHER_BENCH_POSTGRES") or os.environ.get("TETHER_TEST_POSTGRES"):
        targets["postgres"] = (_postgres(), _postgres())
    for name, (where, stock_where) in targets.items():
        wall, cpu = time_durable(where)
        stock_wall, stock_cpu = time_durable(stock_where, fastpath=False)
        stores[name] = {"checkpoint_ms_per_step": round((wall - memory) * 1000 / steps, 3),
                        "checkpoint_cpu_ms_per_step": round((cpu - memory_cpu) * 1000 / steps, 3),
                        "durable_ms_per_turn": round(wall * 1000 / turns, 3),
                        "checkpoint_ms_per_step_stock_dbos": round((stock_wall - memory) * 1000 / steps, 3),
                        "checkpoint_cpu_ms_per_step_stock_dbos": round((stock_cpu - memory_cpu) * 1000 / steps, 3)}
        for key, fastpath, file in (("noop_dbos_step_ms", True, "bare-steps.db"),
                                    ("noop_dbos_step_ms_stock_dbos", False, "bare-steps-stock.db")):
            where = _postgres() if name == "postgres" else str(tmp / file)
            stores[name][key] = round(bare_dbos_step_ms(where, fastpath=fastpath), 3)
    n = 2 * TURNS + 1
    bare = {"wal_normal": round(bare_sqlite_ms(tmp / "bare-wal.db", "WAL", n * 4), 3),
            "rollback_full": round(bare_sqlite_ms(tmp / "bare-delete.db", "DELETE", n * 4), 3)}
    for name in targets:
        # a fresh database for each crash test (the worker takes a path or a URL)
        pg = name != "sqlite_wal"
        window = kill_window(tmp / f"calibrate-{name}", seed=11, database=_postgres() if pg else None)
        report = crash_until_done(tmp / f"crash-{name}", runs=50, seed=11, max_kills=8, kill_after=window,
                                  database=_postgres() if pg else None)
        stores[name].update({k: v for k, v in dataclasses.asdict(report).items() if k != "not_completed"})
        stores[name]["not_completed"] = len(report.not_completed)
        stores[name]["kill_window_seconds"] = [round(t, 2) for t in window]
    results = {
        "in_memory_ms_per_turn": round(memory * 1000 / turns, 4),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "stores": stores,
        "bare_sqlite_ms_per_commit": bare,
        "workload": {"runs": RUNS, "tool_turns_per_run": TURNS, "dbos_steps": steps, "repeats": REPEATS},
        "bar": {"checkpoint_ms_per_step_sqlite_wal": 3.0},
    }
    print(f"{'store':<12} {'ms/step ckpt':>12} {'cpu ms':>7} {'stock':>6} {'ms/turn':>9} {'runs':>5} {'lost':>5} "
          f"{'dup':>4} {'kills':>6} {'taint kept':>10}")
    print(f"{'in-memory':<12} {'-':>12} {'-':>7} {'-':>6} {results['in_memory_ms_per_turn']:>9.3f}")
    for name, s in stores.items():
        print(f"{name:<12} {s['checkpoint_ms_per_step']:>12.3f} {s['checkpoint_cpu_ms_per_step']:>7.3f} "
              f"{s['checkpoint_ms_per_step_stock_dbos']:>6.2f} {s['durable_ms_per_turn']:>9.3f} {s['runs']:>5} "
              f"{s['lost_runs']:>5} {s['duplicate_side_effects']:>4} {s['kills']:>6} "
              f"{s['tainted_resume_blocked']:>4}/{s['tainted_killed_before_attack']:<5}")
    print(f"bare sqlite3 commit: WAL/NORMAL {bare['wal_normal']} ms, rollback/FULL {bare['rollback_full']} ms")
    kept = json.loads(OUT.read_text()) if OUT.exists() else {}  # other benches' figures (wake.py's approval_wake)
    OUT.write_text(json.dumps({**kept, **results}, indent=2) + "\n")
    print(f"wrote {OUT}")
    drop_postgres_databases()
    return 0


if __name__ == "__main__":
    sys.exit(main())
