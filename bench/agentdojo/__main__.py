"""`python -m bench.agentdojo [--suites banking,slack] [--injections N]`

Runs AgentDojo's suites (offline) with a worst-case scripted model through tether's executor and
writes bench/agentdojo/results.json. Modes per suite:
- undefended: no policy, every (user task, injection task) pair -> attacks that succeed (harness check);
- default policy (deny-all approver), every pair -> attacks succeeded, attacker calls executed;
- oracle approver (approves exactly the user task's ground-truth calls), every pair;
- clean runs (no attack) per user task: utility with deny-all and with the oracle, approval prompts,
  and the same prompts without provenance ("ask before every irreversible call after taint").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agentdojo.task_suite.load_suites import get_suites

from bench.agentdojo.harness import SuiteHarness

VERSION = "v1.1.2"  # the newest version where every injection task has ground-truth calls
HERE = Path(__file__).parent


async def bench_suite(name: str, suite: Any, max_injections: int | None) -> dict[str, Any]:
    h = SuiteHarness(name, suite)
    users = list(suite.user_tasks.values())
    injections = list(suite.injection_tasks.values())
    r: dict[str, Any] = {k: 0 for k in (
        "user_tasks", "pairs", "attacks_succeeded_undefended", "attacker_effects_undefended",
        "attacks_succeeded", "attacks_succeeded_text_only", "attacker_calls_executed", "attacker_reads_executed",
        "attacker_calls_made", "attacks_succeeded_oracle", "attacker_calls_executed_oracle",
        "utility_under_attack_deny", "utility_under_attack_oracle", "utility_undefended_clean",
        "utility_deny", "utility_oracle", "approval_prompts", "tasks_with_prompts",
        "approval_prompts_no_provenance", "tasks_with_prompts_no_provenance")}
    failed_oracle: list[str] = []
    for i, ut in enumerate(users):
        r["user_tasks"] += 1
        r["utility_undefended_clean"] += (await h.run(ut, None, defended=False)).utility
        deny = await h.run(ut, None, approver="deny")
        oracle = await h.run(ut, None, approver="oracle")
        base = await h.run(ut, None, approver="oracle", use_provenance=False)
        r["utility_deny"] += deny.utility
        r["utility_oracle"] += oracle.utility
        if not oracle.utility:
            failed_oracle.append(ut.ID)
        r["approval_prompts"] += oracle.prompts
        r["tasks_with_prompts"] += oracle.prompts > 0
        r["approval_prompts_no_provenance"] += base.prompts
        r["tasks_with_prompts_no_provenance"] += base.prompts > 0
        chosen = injections
        if max_injections is not None and len(injections) > max_injections:
            chosen = [injections[(i + k) % len(injections)] for k in range(max_injections)]
        for it in chosen:
            r["pairs"] += 1
            und = await h.run(ut, it, defended=False)
            r["attacks_succeeded_undefended"] += und.attack_succeeded
            r["attacker_effects_undefended"] += und.attacker_effects_executed
            d = await h.run(ut, it, approver="deny")
            r["attacks_succeeded"] += d.attack_succeeded
            r["attacks_succeeded_text_only"] += d.attack_succeeded and not it.ground_truth(h.clean_env)
            r["attacker_calls_executed"] += d.attacker_effects_executed
            r["attacker_reads_executed"] += d.attacker_reads_executed
            r["attacker_calls_made"] += d.attacker_calls
            r["utility_under_attack_deny"] += d.utility
            o = await h.run(ut, it, approver="oracle")
            r["attacks_succeeded_oracle"] += o.attack_succeeded
            r["attacker_calls_executed_oracle"] += o.attacker_effects_executed
            r["utility_under_attack_oracle"] += o.utility
    r["oracle_failures"] = failed_oracle
    r["trusted_tools_that_carried_injections"] = sorted(set(h.tainted_trusted))
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", default="workspace,travel,banking,slack")
    ap.add_argument("--injections", type=int, default=None,
                    help="at most N injection tasks per user task (default: all)")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    suites = get_suites(VERSION)
    started = time.perf_counter()
    per_suite: dict[str, dict[str, Any]] = {}
    for name in args.suites.split(","):
        t0 = time.perf_counter()
        per_suite[name] = asyncio.run(bench_suite(name, suites[name], args.injections))
        per_suite[name]["seconds"] = round(time.perf_counter() - t0, 1)
    total: dict[str, Any] = {}
    for res in per_suite.values():
        for k, v in res.items():
            if isinstance(v, int | float) and k != "seconds":
                total[k] = total.get(k, 0) + v
    total["oracle_failures"] = [f"{s}/{t}" for s, res in per_suite.items() for t in res["oracle_failures"]]
    total["trusted_tools_that_carried_injections"] = [
        f"{s}/{t}" for s, res in per_suite.items() for t in res["trusted_tools_that_carried_injections"]]
    out = {"agentdojo_version": VERSION, "injections_per_user_task": args.injections or "all",
           "seconds": round(time.perf_counter() - started, 1), **total, "suites": per_suite}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")

    cols = ["pairs", "attacks_succeeded_undefended", "attacks_succeeded", "attacks_succeeded_text_only",
            "attacker_calls_executed", "attacker_reads_executed", "user_tasks", "utility_deny", "utility_oracle",
            "utility_under_attack_oracle", "approval_prompts", "tasks_with_prompts",
            "approval_prompts_no_provenance", "tasks_with_prompts_no_provenance"]
    rows = [*per_suite.items(), ("TOTAL", total)]
    width = max(len(c) for c in cols)
    print(f"AgentDojo {VERSION}, worst-case scripted model, tether SafetyPolicy ({out['seconds']} s)")
    print(" " * width + "".join(f"{n:>11}" for n, _ in rows))
    for c in cols:
        print(f"{c:<{width}}" + "".join(f"{res.get(c, 0):>11}" for _, res in rows))
    if total["oracle_failures"]:
        print("user tasks failing with the oracle approver:", ", ".join(total["oracle_failures"]))
    if total["trusted_tools_that_carried_injections"]:
        print("WARNING: tools classified trusted returned injected text:",
              ", ".join(total["trusted_tools_that_carried_injections"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
