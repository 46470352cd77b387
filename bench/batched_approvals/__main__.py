"""Batched approvals (issue 44, item 5): how many questions a person answers on AgentDojo's clean runs.

    python -m bench.batched_approvals [--suites banking,slack,travel,workspace]

The default loop (default mode, `bench` classification, oracle approver) on every clean user task,
three ways: the model announces one call per turn (as `python -m bench.agentdojo` does); it
announces consecutive calls with an effect in one turn and the approver is asked per call (an
approver without `request_batch`: the count before batching); and the same turns answered as one
question each (`request_batch`). Utility must not change. Writes bench/batched_approvals/results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agentdojo.task_suite.load_suites import get_suites

from bench.agentdojo.__main__ import VERSION
from bench.agentdojo.harness import CLASSIFICATIONS, SuiteHarness

HERE = Path(__file__).parent
WAYS = {"one_call_per_turn": {}, "grouped_per_call": {"group_effects": True},
        "grouped_batched": {"group_effects": True, "batches": True}}


async def suite_figures(name: str) -> dict[str, Any]:
    suite = get_suites(VERSION)[name]
    h = SuiteHarness(name, suite, CLASSIFICATIONS["bench"])
    out: dict[str, Any] = {"user_tasks": len(suite.user_tasks)}
    for way, options in WAYS.items():
        fig = {"utility_oracle": 0, "approval_prompts": 0, "tasks_with_prompts": 0}
        for ut in suite.user_tasks.values():
            r = await h.run(ut, None, approver="oracle", **options)
            fig["utility_oracle"] += r.utility
            fig["approval_prompts"] += r.prompts
            fig["tasks_with_prompts"] += r.prompts > 0
        out[way] = fig
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", default="banking,slack,travel,workspace")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    results: dict[str, Any] = {"agentdojo": VERSION, "mode": "default", "classification": "bench",
                               "suites": {s: asyncio.run(suite_figures(s)) for s in args.suites.split(",")}}
    results["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'suite':<10} {'way':<18} {'utility':>8} {'prompts':>8} {'(tasks)':>8}")
    for s, fig in results["suites"].items():
        for way in WAYS:
            f = fig[way]
            print(f"{s:<10} {way:<18} {f['utility_oracle']:>4}/{fig['user_tasks']:<3} {f['approval_prompts']:>8} "
                  f"({f['tasks_with_prompts']})")


if __name__ == "__main__":
    main()
