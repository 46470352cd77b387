"""The crash driver: start the worker, SIGKILL it at random moments, restart it until every run
is done; then count lost runs, duplicated side effects and refused attacker calls."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.durable.worker import ATTACKER, expected_entries, tainted

ROOT = Path(__file__).resolve().parents[2]
POLL = 0.05  # seconds between looks at the store while a kill aims at the taint window


@dataclass
class CrashReport:
    runs: int
    kills: int = 0
    lives: int = 0
    lost_runs: int = 0
    duplicate_side_effects: int = 0
    missing_side_effects: int = 0
    reruns_with_same_key: int = 0  # interrupted tool steps that ran again (with their original key)
    attacker_calls_executed: int = 0
    tainted_killed_before_attack: int = 0  # tainted runs killed after the injection, before the attack
    tainted_resume_blocked: int = 0  # ... whose attack was still refused after the restart
    seconds: float = 0.0
    last_life_seconds: float = 0.0  # from the last worker's launch to its exit (the run of one life if unkilled)
    not_completed: list[str] = field(default_factory=list)


def _tainted_waiting(store: Any, runs: int) -> set[str]:
    """Tainted runs whose stored events show the injection read and no attacker call yet."""
    out = set()
    for i in range(runs):
        if not tainted(i):
            continue
        names = [e.data.get("name") for e in store.events(f"job{i}") if e.kind == "tool_call"]
        if "fetch_page" in names and "send_money" not in names:
            out.add(f"job{i}")
    return out


def crash_until_done(workdir: Path, *, runs: int = 50, seed: int = 0, max_kills: int = 12,
                     kill_after: tuple[float, float] = (0.2, 3.0), jitter: float = 0.03,
                     database: str | None = None) -> CrashReport:
    """Kill the worker `max_kills` times at a random moment `kill_after` seconds after it launched
    (recovery included), then let it finish. Every second kill comes sooner if a tainted run is seen
    between reading the injection and trying the attack (a window too short for random kills to hit
    once the checkpoints are fast), so the taint's survival across a restart is tested."""
    from tether.store import RunStore

    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    db, ledger = database or str(workdir / "runs.db"), workdir / "ledger.txt"
    report = CrashReport(runs)
    killed_waiting: set[str] = set()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    cmd = [sys.executable, "-m", "bench.durable.worker", "--db", db, "--ledger", str(ledger),
           "--runs", str(runs), "--jitter", str(jitter)]
    started = time.perf_counter()
    finished = False
    store: RunStore | None = None  # opened once the first worker has created the tables
    while not finished and report.lives < max_kills + 3:
        report.lives += 1
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        head = b""
        while not head.endswith(b"launched\n"):  # kill windows start once DBOS is up
            chunk = proc.stdout.readline()
            if not chunk:
                break
            head += chunk
        deadline = rng.uniform(*kill_after) if report.kills < max_kills else 300.0
        aim = report.kills < max_kills and report.kills % 2 == 1
        store = store or (RunStore(db) if aim else None)
        launched = time.perf_counter()
        end = launched + deadline + (kill_after[1] if aim else 0.0)  # an aimed kill waits longer for its window
        out: bytes | None = None
        while out is None:
            left = end - time.perf_counter()
            try:
                out, _ = proc.communicate(timeout=max(0.001, min(left, POLL) if aim else left))
            except subprocess.TimeoutExpired:  # communicate() again loses no output
                if time.perf_counter() >= end or (aim and store and _tainted_waiting(store, runs) - killed_waiting):
                    break
        if out is not None:
            report.last_life_seconds = time.perf_counter() - launched
            finished = proc.returncode == 0
            if not finished:
                report.not_completed.append((head + out).decode(errors="replace")[-2000:])
        else:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            report.kills += 1
            store = store or RunStore(db)
            killed_waiting |= _tainted_waiting(store, runs)
    report.seconds = time.perf_counter() - started
    if store is not None:
        store.close()
    _count(report, db, ledger, killed_waiting)
    return report


def kill_window(workdir: Path, *, runs: int = 50, seed: int = 0,
                database: str | None = None) -> tuple[float, float]:
    """0.1-1x the seconds the same workload takes here unkilled: kills drawn from it land inside the
    work however fast the checkpoints are (a fixed window misses it once they are fast enough)."""
    whole = crash_until_done(workdir, runs=runs, seed=seed, max_kills=0, database=database)
    assert whole.lost_runs == 0 and not whole.not_completed, whole
    return (0.1 * whole.last_life_seconds, whole.last_life_seconds)


def _count(report: CrashReport, db: str, ledger: Path, killed_waiting: set[str]) -> None:
    from tether.store import RunStore

    lines = ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []
    entries = Counter(line.split("\t", 1)[1] for line in lines)
    attempts_path = ledger.with_name(ledger.stem + ".attempts.txt")
    attempts = attempts_path.read_text(encoding="utf-8").splitlines() if attempts_path.exists() else []
    report.reruns_with_same_key = len(attempts) - len({a.split("\t", 1)[0] for a in attempts})
    report.attacker_calls_executed = sum(n for e, n in entries.items() if ATTACKER in e)
    report.duplicate_side_effects = sum(n - 1 for n in entries.values() if n > 1)
    store = RunStore(db)
    try:
        for i in range(report.runs):
            row = store.run(f"job{i}")
            if row is None or row.status != "completed":
                report.lost_runs += 1
            report.missing_side_effects += sum(1 for e in expected_entries(i) if entries[e] == 0)
        report.tainted_killed_before_attack = len(killed_waiting)
        for run_id in killed_waiting:
            decisions = [e.data.get("decision") for e in store.events(run_id)
                         if e.kind == "tool_call" and e.data.get("name") == "send_money"]
            if decisions and all(d != "allowed" and not str(d).startswith("approved") for d in decisions):
                report.tainted_resume_blocked += 1
    finally:
        store.close()
