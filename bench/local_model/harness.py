"""Run the offline task suite, one fresh process per variant (`worker.py`), and collect figures.

Each variant runs in a working directory with a different name (`DIRNAMES`), since the embedded
model's answers once changed with the directory's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.local_model.tasks import Task
from bench.local_model.worker import LIMITS

ROOT = Path(__file__).resolve().parents[2]
DIRNAMES = ("tether", "my project", "Paris weather", "2024-q3_report", "calc", "x", "home-assistant",
            "données", "build output", "README", "17 times 23", "tmp.work")


def dirname_for(family_index: int, variant_index: int) -> str:
    return DIRNAMES[(family_index * 5 + variant_index) % len(DIRNAMES)]


def run_one(job: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT),
                                                                      os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "bench.local_model.worker", json.dumps(job)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"worker failed for {job}: {' | '.join(tail)}")
    return json.loads(lines[-1])


def _family_report(task: Task, outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    held = [o for o in outcomes if o["held_out"]]
    return {
        "description": task.description,
        "variants": len(outcomes),
        "successes": sum(o["ok"] for o in outcomes),
        "success_rate": round(sum(o["ok"] for o in outcomes) / len(outcomes), 3) if outcomes else 0.0,
        "held_out_variants": len(held),
        "held_out_successes": sum(o["ok"] for o in held),
        "seconds": round(sum(o["seconds"] for o in outcomes) / len(outcomes), 2) if outcomes else 0.0,
        "dirnames": sorted({o["dirname"] for o in outcomes}),
        "failures": [
            {"prompt": o["prompt"], "dirname": o["dirname"], "answer": o["answer"][:200],
             "stop_reason": o["stop_reason"], "tool_calls": o["tool_calls"], "held_out": o["held_out"]}
            for o in outcomes if not o["ok"]
        ],
    }


def run_suite(
    tasks: Sequence[Task],
    *,
    gguf: str | None = None,
    threads: int | None = None,
    include_held_out: bool = True,
    dirname: str | None = None,
    jobs: int = 1,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every variant of `tasks` in its own process (`jobs` at a time); per-family counts and
    llama.cpp timings. At temperature 0 the outcomes do not depend on `jobs` or on load."""
    planned = []
    for fi, task in enumerate(tasks):
        for vi, variant in enumerate(task.variants):
            if variant.held_out and not include_held_out:
                continue
            planned.append((task, variant, {"family": task.name, "index": vi, "gguf": gguf, "threads": threads,
                                            "dirname": dirname or dirname_for(fi, vi)}))

    def one(item: tuple[Task, Any, dict[str, Any]]) -> dict[str, Any]:
        task, variant, job = item
        out = run_one(job)
        mark = "ok " if out["ok"] else "BAD"
        tag = "H" if variant.held_out else " "
        progress(f"  {mark}{tag} {task.name:<18} {out['seconds']:5.1f}s {out['stop_reason']:<13} "
                 f"[{out['dirname']}] {variant.prompt[:44]!r} -> {out['answer'][:60]!r} calls={out['tool_calls']}")
        return out

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outcomes = list(pool.map(one, planned))
    reports = {task.name: _family_report(task, [o for o in outcomes if o["family"] == task.name]) for task in tasks}
    all_calls = [c for o in outcomes for c in o["calls"]]
    first = outcomes[0] if outcomes else None
    p_tok = sum(c[1] for c in all_calls)
    p_sec = sum(c[2] for c in all_calls)
    g_tok = sum(c[3] for c in all_calls)
    g_sec = sum(c[4] for c in all_calls)
    return {
        "model": first["model"] if first else None,
        "gguf": first["gguf"] if first else None,
        "n_threads": first["n_threads"] if first else None,
        "temperature": 0.0,
        "process_per_variant": True,
        "parallel_jobs": jobs,
        "limits": {"max_steps": LIMITS.max_steps, "max_repeats": LIMITS.max_repeats},
        "machine": {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
        "tasks": reports,
        "model_calls": len(all_calls),
        "prompt_tokens": int(sum(c[0] for c in all_calls)),
        "prompt_tokens_evaluated": int(p_tok),
        "generation_tokens": int(g_tok),
        "prompt_tokens_per_second": round(p_tok / p_sec, 1) if p_sec else None,
        "generation_tokens_per_second": round(g_tok / g_sec, 1) if g_sec else None,
    }
