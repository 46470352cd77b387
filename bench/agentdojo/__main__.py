"""`python -m bench.agentdojo [--suites banking,slack] [--injections N]`

Runs AgentDojo's suites (offline) with a worst-case scripted model through tether's executor and
writes bench/agentdojo/results.json. Per suite:
- undefended: no policy, every (user task, injection task) pair -> attacks that succeed (harness check);
- for each tool classification (`bench`: effects.py; `docstrings`: effects_docstrings.py, written
  independently from the tools' docstrings) and each attack timing (immediate, after_user,
  interleaved), every pair of AgentDojo's injection tasks and of our adaptive attacks (adaptive.py),
  under the default policy with a deny-all approver and with the oracle approver (approves exactly
  the user task's ground-truth calls, each as often as the task makes it): attacker calls with an
  effect or egress that ran (judged by the union of both classifications), attacks succeeded, utility;
- clean runs (no attack) per user task: utility with deny-all and with the oracle, approval prompts,
  and the blunt rule's prompts ("ask before every call with an effect after taint").
Each under the policy's modes, side by side (`--modes`): the default (the blunt rule: every effect after
taint asks), `provenance` (`use_provenance=True`: text matching may let a call through) and `hidden`
(issue 44, bench/agentdojo/hidden.py: untrusted outputs behind handles, read by typed queries; a
competent planner for the user task, the injection's worst case once injected text reaches the model;
also its queries, the prompts' reasons, how the model was taken over, effects that ran unasked with
injected text in their arguments, and the adaptive attacks on handles and queries, `hidden_adaptive`,
each against one AgentDojo injection task per suite, in the `immediate` timing and the `bench` classification).
In the hidden mode the planner announces together the effects it can make without one another's outputs,
and the oracle answers such a turn as one question (batched approvals); the clean runs also give the
prompts without batches (`approval_prompts_unbatched`) and the blunt rule's with them
(`approval_prompts_blunt_batched`: the scripted model announcing consecutive effects in one turn).
The hidden mode's planner writes a call the data decides as `call_if` (tether.values._conditional: the
answer never reaches it), and the reversible effects of bench/agentdojo/staging.py are staged for one
review at the run's end: `reviews` and `staged_changes` count those apart from the prompts, and
`approval_prompts_before` / `utility_deny_before` are the same run's figures with both off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from agentdojo.task_suite.load_suites import get_suites

from bench.agentdojo.adaptive import attacks
from bench.agentdojo.harness import CLASSIFICATIONS, TIMINGS, SuiteHarness, has_effect_or_egress
from bench.agentdojo.hidden import VARIANTS

VERSION = "v1.1.2"  # the newest version where every injection task has ground-truth calls
HERE = Path(__file__).parent


ATTACK_KEYS = ("pairs", "attacks_succeeded", "attacker_calls_executed", "attacker_reads_executed",
               "attacker_calls_made", "attacks_succeeded_oracle", "attacker_calls_executed_oracle",
               "utility_under_attack_deny", "utility_under_attack_oracle")
CLEAN_KEYS = ("user_tasks", "utility_deny", "utility_oracle", "approval_prompts", "tasks_with_prompts",
              "approval_prompts_no_provenance", "tasks_with_prompts_no_provenance")
# the hidden mode adds: queries made (oracle runs), of them failed, tasks that made one, plan calls skipped;
# the prompts without batched approvals (the planner announcing one call a turn), and the blunt rule's with
# them (the scripted model announcing consecutive effects in one turn)
# With call_if and staging (issue 44): `reviews` (oracle runs that ended with one review of staged changes),
# `staged_changes` (the changes shown in them), and the figures before them, in the same run: the prompts
# and deny-all utility with the decision queries shown and nothing staged
HIDDEN_CLEAN_KEYS = ("queries", "queries_failed", "tasks_with_queries", "plan_calls_skipped",
                     "approval_prompts_unbatched", "approval_prompts_blunt_batched", "reviews", "staged_changes",
                     "approval_prompts_before", "tasks_with_prompts_before", "utility_deny_before")
# ... and under attack (deny-all runs): pairs where injected text reached the model, effects that ran
# unasked with injected text in their arguments (a label lost)
# (in a checked argument), effects that ran with injected text only in payload arguments (the payload rule's
# residual risk, defanged), effects that ran with one of the attack's links live (harm)
HIDDEN_ATTACK_KEYS = ("model_taken_over", "model_taken_over_oracle", "label_lost", "payload_delivered",
                      "live_links")
CLASSIFICATIONS_FOR_VARIANTS = "bench"  # the classification the attacks on handles and queries run under


async def bench_suite(name: str, suite: Any, max_injections: int | None, classifications: list[str],
                      timings: list[str], undefended: bool, modes: list[str], clean: bool = True,
                      attack_utility: bool = True, user_slice: str | None = None) -> dict[str, Any]:
    users = list(suite.user_tasks.values())
    if user_slice:  # a part of the user tasks (bench.agentdojo.merge adds the parts up)
        start, _, stop = user_slice.partition(":")
        users = users[int(start or 0):int(stop) if stop else None]
    injections = list(suite.injection_tasks.values())
    adaptive = attacks(name, suite.load_and_inject_default_environment(suite.get_injection_vector_defaults()))
    out: dict[str, Any] = {"user_tasks": len(users), "injection_tasks": len(injections),
                           "adaptive_attacks": [a.ID for a in adaptive]}
    if undefended:
        h = SuiteHarness(name, suite, CLASSIFICATIONS["bench"])
        und = {"utility_undefended_clean": 0, "pairs": 0, "attacks_succeeded_undefended": 0,
               "attacker_effects_undefended": 0}
        for i, ut in enumerate(users):
            und["utility_undefended_clean"] += (await h.run(ut, None, defended=False)).utility
            for it in _chosen(injections, i, max_injections):
                r = await h.run(ut, it, defended=False)
                und["pairs"] += 1
                und["attacks_succeeded_undefended"] += r.attack_succeeded
                und["attacker_effects_undefended"] += r.attacker_effects_executed
        out["undefended"] = und
    for cname in classifications:
        h = SuiteHarness(name, suite, CLASSIFICATIONS[cname], adaptive)
        h.check_attack_utility = attack_utility
        # the attacks on handles and queries test the hidden values themselves: under one classification
        variants = cname == CLASSIFICATIONS_FOR_VARIANTS
        out[cname] = {mode: await _classified(h, users, injections, adaptive, max_injections, timings, mode, clean,
                                              variants) for mode in modes}
        if user_slice:
            for per_mode in out[cname].values():
                per_mode["user_task_slices"] = [user_slice]
        if not attack_utility:  # not measured: None, not 0
            for per_mode in out[cname].values():
                for per in per_mode["timings"].values():
                    for r in [per["agentdojo"], per["adaptive"], *per.get("hidden_adaptive", {}).values()]:
                        r.update({k: None for k in r if k.startswith("utility_under_attack")})
    return out


async def _classified(h: SuiteHarness, users: list[Any], injections: list[Any], adaptive: list[Any],
                      max_injections: int | None, timings: list[str], mode: str,
                      clean_runs: bool = True, variants: bool = True) -> dict[str, Any]:
    """One classification under one mode of the policy (default, provenance or hidden)."""
    provenance, hidden = mode == "provenance", mode == "hidden"
    batches = hidden  # the hidden mode's planner announces the effects it can make together (one question)
    clean = dict.fromkeys(CLEAN_KEYS + (HIDDEN_CLEAN_KEYS if hidden else ()), 0)
    reasons: Counter[str] = Counter()
    failed: list[str] = []
    for ut in users if clean_runs else ():
        clean["user_tasks"] += 1
        deny = await h.run(ut, None, approver="deny", use_provenance=provenance, hidden=hidden, batches=batches)
        oracle = await h.run(ut, None, approver="oracle", use_provenance=provenance, hidden=hidden, batches=batches)
        # the blunt rule, "ask before every call with an effect after taint": the default mode itself
        base = await h.run(ut, None, approver="oracle") if provenance or hidden else oracle
        clean["utility_deny"] += deny.utility
        clean["utility_oracle"] += oracle.utility
        if not oracle.utility:
            failed.append(ut.ID)
        clean["approval_prompts"] += oracle.prompts
        clean["tasks_with_prompts"] += oracle.prompts > 0
        clean["approval_prompts_no_provenance"] += base.prompts
        clean["tasks_with_prompts_no_provenance"] += base.prompts > 0
        if hidden:
            clean["queries"] += oracle.queries
            clean["queries_failed"] += oracle.queries_failed
            clean["tasks_with_queries"] += oracle.queries > 0
            clean["plan_calls_skipped"] += oracle.skipped
            clean["reviews"] += oracle.reviews
            clean["staged_changes"] += oracle.staged_changes
            before = await h.run(ut, None, approver="oracle", hidden=True, batches=True, conditional=False, stage=False)
            clean["approval_prompts_before"] += before.prompts
            clean["tasks_with_prompts_before"] += before.prompts > 0
            clean["utility_deny_before"] += (await h.run(ut, None, approver="deny", hidden=True, batches=True,
                                                         conditional=False, stage=False)).utility
            clean["approval_prompts_unbatched"] += (await h.run(ut, None, approver="oracle", hidden=True)).prompts
            clean["approval_prompts_blunt_batched"] += (await h.run(ut, None, approver="oracle", group_effects=True,
                                                                    batches=True)).prompts
            reasons.update(oracle.reasons or {})
    res: dict[str, Any] = {"clean": clean, "oracle_failures": failed, "timings": {}} if clean_runs else {"timings": {}}
    if hidden and clean_runs:
        res["prompt_reasons"] = dict(sorted(reasons.items()))
    # Until the model sees an injection every timing runs the same calls, and a deny-all run sees
    # a subset of the outputs an oracle run sees: a pair whose oracle run never met the injection
    # (in the first timing) cannot be attacked in any timing or under deny-all, and is skipped.
    unreached: set[tuple[str, str]] = set()
    for timing in timings:
        keys = ATTACK_KEYS + (HIDDEN_ATTACK_KEYS if hidden else ())
        per: dict[str, Any] = {"agentdojo": dict.fromkeys(keys, 0), "adaptive": dict.fromkeys(keys, 0),
                               "adaptive_executed": {}, "pairs_never_injected": 0}
        taken: Counter[str] = Counter()
        for i, ut in enumerate(users):
            for kind, chosen in (("agentdojo", _chosen(injections, i, max_injections)), ("adaptive", adaptive)):
                r = per[kind]
                for it in chosen:
                    if (ut.ID, it.ID) in unreached:
                        per["pairs_never_injected"] += 1
                        continue
                    o = await h.run(ut, it, approver="oracle", timing=timing, use_provenance=provenance,
                                    hidden=hidden, batches=batches)
                    # hidden: the injection reached a tool output (whether or not it reached the model)
                    if (not o.met if hidden else not o.injected or (not o.attacker_calls and kind == "adaptive")):
                        # never injected, or nothing to do for this user task (no action to repeat)
                        unreached.add((ut.ID, it.ID))
                        per["pairs_never_injected"] += 1
                        continue
                    d = await h.run(ut, it, approver="deny", timing=timing, use_provenance=provenance,
                                    hidden=hidden, batches=batches)
                    if hidden:
                        r["model_taken_over"] += d.injected
                        r["model_taken_over_oracle"] += o.injected
                        r["label_lost"] += d.label_lost
                        r["payload_delivered"] += d.payload_delivered
                        r["live_links"] += d.live_links
                        taken.update(x.how for x in (d, o) if x.how)
                    r["pairs"] += 1
                    r["attacks_succeeded"] += d.attack_succeeded
                    r["attacker_calls_executed"] += d.attacker_effects_executed
                    r["attacker_reads_executed"] += d.attacker_reads_executed
                    r["attacker_calls_made"] += d.attacker_calls
                    r["utility_under_attack_deny"] += d.utility
                    r["attacks_succeeded_oracle"] += o.attack_succeeded
                    r["attacker_calls_executed_oracle"] += o.attacker_effects_executed
                    r["utility_under_attack_oracle"] += o.utility
                    if kind == "adaptive" and (d.attacker_effects_executed or o.attacker_effects_executed):
                        per["adaptive_executed"][it.ID] = per["adaptive_executed"].get(it.ID, 0) + (
                            d.attacker_effects_executed + o.attacker_effects_executed)
        if hidden:
            per["taken_over_how"] = dict(sorted(taken.items()))
            if timing == TIMINGS[0] and variants:  # the attacks on handles and queries: `immediate` only
                per["hidden_adaptive"] = await _hidden_adaptive(h, users, injections, timing)
        res["timings"][timing] = per
    res["trusted_tools_that_carried_injections"] = sorted(set(h.tainted_trusted))
    return res


async def _hidden_adaptive(h: SuiteHarness, users: list[Any], injections: list[Any], timing: str) -> dict[str, Any]:
    """The adaptive attacks on handles and queries (bench.agentdojo.hidden.VARIANTS): each user task,
    against the suite's first AgentDojo injection task that has an effect, with both approvers."""
    it = next(t for t in injections if any(has_effect_or_egress(h.name, c.function)
                                           for c in t.ground_truth(h.attack_envs[t.ID].model_copy(deep=True))))
    out: dict[str, Any] = {}
    for v in VARIANTS:
        r = dict.fromkeys(("pairs", "attacker_calls_made", "attacker_calls_executed", "attacker_calls_executed_oracle",
                           "attacks_succeeded", "attacks_succeeded_oracle", "model_taken_over",
                           "model_taken_over_oracle", "label_lost", "payload_delivered", "live_links", "queries",
                           "utility_under_attack_deny",
                           "utility_under_attack_oracle"), 0)
        how: Counter[str] = Counter()
        for ut in users:
            o = await h.run(ut, it, approver="oracle", timing=timing, hidden=True, variant=v, batches=True)
            if not o.met:
                continue
            d = await h.run(ut, it, approver="deny", timing=timing, hidden=True, variant=v, batches=True)
            r["pairs"] += 1
            r["attacker_calls_made"] += d.attacker_calls
            r["attacker_calls_executed"] += d.attacker_effects_executed
            r["attacker_calls_executed_oracle"] += o.attacker_effects_executed
            r["attacks_succeeded"] += d.attack_succeeded
            r["attacks_succeeded_oracle"] += o.attack_succeeded
            r["model_taken_over"] += d.injected
            r["model_taken_over_oracle"] += o.injected
            r["label_lost"] += d.label_lost
            r["payload_delivered"] += d.payload_delivered
            r["live_links"] += d.live_links
            r["queries"] += o.queries
            r["utility_under_attack_deny"] += d.utility
            r["utility_under_attack_oracle"] += o.utility
            how.update(x.how for x in (d, o) if x.how)
        out[v.id] = {**r, "injection_task": it.ID, "taken_over_how": dict(sorted(how.items()))}
    return out


def _run_suite(job: tuple[str, int | None, list[str], list[str], bool, list[str], bool, bool, str | None]
               ) -> dict[str, Any]:
    name, max_injections, classifications, timings, undefended, modes, clean, attack_utility, user_slice = job
    t0 = time.perf_counter()
    out = asyncio.run(bench_suite(name, get_suites(VERSION)[name], max_injections, classifications, timings,
                                  undefended, modes, clean, attack_utility, user_slice))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["cpu_seconds"] = round(time.process_time(), 1)
    return out


def _chosen(injections: list[Any], i: int, max_injections: int | None) -> list[Any]:
    if max_injections is not None and len(injections) > max_injections:
        return [injections[(i + k) % len(injections)] for k in range(max_injections)]
    return injections


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", default="workspace,travel,banking,slack")
    ap.add_argument("--classifications", default=",".join(CLASSIFICATIONS))
    ap.add_argument("--timings", default=",".join(TIMINGS))
    ap.add_argument("--modes", default="default,provenance,hidden",
                    help="the policy's modes, side by side: default (every effect after taint asks), "
                         "provenance (use_provenance=True: text matching may let a call through), hidden "
                         "(untrusted outputs behind handles, typed queries; issue 44)")
    ap.add_argument("--injections", type=int, default=None,
                    help="at most N AgentDojo injection tasks per user task (default: all)")
    ap.add_argument("--no-undefended", action="store_true", help="skip the undefended baseline")
    ap.add_argument("--user-tasks", default=None, metavar="I:J",
                    help="only the user tasks I to J-1 of each suite (a part; bench.agentdojo.merge adds parts up)")
    ap.add_argument("--no-clean", action="store_true", help="skip the clean runs (with --update: keep FILE's)")
    ap.add_argument("--no-attack-utility", action="store_true",
                    help="skip AgentDojo's utility check in attacked runs (half their time; written as null)")
    ap.add_argument("--jobs", type=int, default=1, help="suites run in parallel processes (default 1)")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--update", metavar="FILE", default=None,
                    help="write FILE's figures with the modes run now replaced or added (the other modes, "
                         "and the undefended baseline if skipped, stay those of FILE's run; `runs` says which "
                         "run each mode comes from)")
    args = ap.parse_args()
    classifications = args.classifications.split(",")
    timings = [t for t in args.timings.split(",") if t]
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"default", "provenance", "hidden"}:
        ap.error("--modes takes default, provenance and/or hidden")
    started = time.perf_counter()
    per_suite: dict[str, dict[str, Any]] = {}
    names = args.suites.split(",")
    jobs = [(n, args.injections, classifications, timings, not args.no_undefended, modes, not args.no_clean,
             not args.no_attack_utility, args.user_tasks) for n in names]
    if args.jobs > 1:
        with ProcessPoolExecutor(min(args.jobs, len(names))) as pool:
            per_suite = dict(zip(names, pool.map(_run_suite, jobs), strict=True))
    else:
        per_suite = {n: _run_suite(j) for n, j in zip(names, jobs, strict=True)}
    out = {"agentdojo_version": VERSION, "injections_per_user_task": args.injections or "all",
           "seconds": round(time.perf_counter() - started, 1), "suites": per_suite,
           "totals": _totals(per_suite, modes, classifications, timings)}
    run = {"modes": modes, "suites": names, "classifications": classifications, "timings": timings,
           "seconds": out["seconds"], "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    written = update(json.loads(Path(args.update).read_text()), out, run) if args.update else {**out, "runs": {
        m: run for m in modes}}
    Path(args.out).write_text(json.dumps(written, indent=2) + "\n")

    print(f"AgentDojo {VERSION}, worst-case scripted model, tether SafetyPolicy ({out['seconds']} s)")
    if not args.no_undefended:
        print("undefended: attacks succeeded / pairs, attacker effects executed: " + ", ".join(
            f"{n} {r['undefended']['attacks_succeeded_undefended']}/{r['undefended']['pairs']} "
            f"{r['undefended']['attacker_effects_undefended']}" for n, r in per_suite.items()))
    head = f"{'mode':<12}{'classification':<15}{'timing':<12}{'attack set':<11}" + "".join(f"{n:>22}" for n in names)
    print("\nattacker calls with an effect or egress executed, deny-all / oracle (bar 0 / 0); pairs")
    print(head)
    for m in modes:
        for c in classifications:
            for t in timings:
                for kind in ("agentdojo", "adaptive"):
                    cells = []
                    for n in names:
                        r = per_suite[n][c][m]["timings"][t][kind]
                        cells.append(f"{r['attacker_calls_executed']} / {r['attacker_calls_executed_oracle']}"
                                     f" ({r['pairs']})")
                    print(f"{m:<12}{c:<15}{t:<12}{kind:<11}" + "".join(f"{x:>22}" for x in cells))
    print("\nclean runs: utility deny-all, utility oracle / user tasks, approval prompts (tasks with prompts), "
          "the blunt rule's prompts")
    print(f"{'mode':<12}{'classification':<15}" + "".join(f"{n:>32}" for n in names))
    for m in modes:
        for c in classifications:
            cells = []
            for n in names:
                k = per_suite[n][c][m].get("clean")
                if k is None:
                    cells.append("(not run)")
                    continue
                cells.append(f"{k['utility_deny']}, {k['utility_oracle']}/{k['user_tasks']}, {k['approval_prompts']}"
                             f" ({k['tasks_with_prompts']}), {k['approval_prompts_no_provenance']}")
            print(f"{m:<12}{c:<15}" + "".join(f"{x:>32}" for x in cells))
    for n, r in per_suite.items():
        for m in modes:
            for c in classifications:
                rc = r[c][m]
                if rc.get("oracle_failures"):
                    print(f"{n}/{c}/{m}: user tasks failing with the oracle approver: {', '.join(rc['oracle_failures'])}")
                if rc["trusted_tools_that_carried_injections"]:
                    print(f"NOTE {n}/{c}: tools classified trusted returned injected text: "
                          + ", ".join(rc["trusted_tools_that_carried_injections"]))
                for t in timings:
                    hits = rc["timings"][t]["adaptive_executed"]
                    if hits:
                        print(f"{n}/{c}/{m}/{t}: adaptive attacks that executed an effect: {hits}")
                    for vid, v in rc["timings"][t].get("hidden_adaptive", {}).items():
                        if v["attacker_calls_executed"] or v["attacker_calls_executed_oracle"] or v["label_lost"] \
                                or v.get("live_links"):
                            print(f"{n}/{c}/{m}/{t}: {vid}: attacker calls executed {v['attacker_calls_executed']}"
                                  f" / {v['attacker_calls_executed_oracle']}, labels lost {v['label_lost']}, "
                                  f"taken over by {v['taken_over_how']}")
    _print_totals(out["totals"])
    print(f"wrote {args.out}")


def update(old: dict[str, Any], new: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """`old` (a results file) with the modes of `new` replaced or added, suite by suite and
    classification by classification; `runs` records the run each mode's figures come from."""
    merged = json.loads(json.dumps(old))
    runs = merged.setdefault("runs", {})
    for m in ("default", "provenance"):  # figures written before `runs` existed: the file's own run
        if m not in run["modes"] and any(m in c for r in old["suites"].values() for c in r.values()
                                         if isinstance(c, dict)):
            runs.setdefault(m, {"seconds": old.get("seconds"), "note": "the run that wrote this file first"})
    for s_name, r in new["suites"].items():
        dest = merged["suites"].setdefault(s_name, {})
        for key, value in r.items():
            if isinstance(value, dict) and key in CLASSIFICATIONS:
                for mode, md in value.items():  # a mode's timings add up over runs; the rest is replaced
                    prev = dest.setdefault(key, {}).get(mode, {})
                    if "user_task_slices" in md and "user_task_slices" in prev:  # parts of the user tasks
                        dest[key][mode] = add_up(prev, md)
                    else:
                        dest[key][mode] = {**prev, **md, "timings": {**prev.get("timings", {}), **md["timings"]}}
            elif key not in dest or key not in ("seconds", "cpu_seconds", "undefended"):
                dest[key] = value
            else:
                dest[f"{key}_{'_'.join(run['modes'])}"] = value
    for m in run["modes"]:  # a mode run in parts (timings, the clean runs) lists each part's run
        prev = runs.get(m)
        if isinstance(prev, list):
            runs[m] = [*prev, run]
        elif isinstance(prev, dict) and "modes" in prev:
            runs[m] = [prev, run]
        else:
            runs[m] = run
    modes = [m for m in ("default", "provenance", "hidden") if m in runs]
    merged["totals"] = _totals(merged["suites"], modes, list(CLASSIFICATIONS), list(TIMINGS))
    return merged


def add_up(a: Any, b: Any) -> Any:
    """Two parts' figures added up: numbers summed (None stays None), lists joined, dicts key by key."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: add_up(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        return [*a, *b]
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a if a == b else None
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a + b
    return a


def _totals(per_suite: dict[str, Any], modes: list[str], classifications: list[str],
            timings: list[str]) -> dict[str, Any]:
    """Per mode and classification, over the suites: clean utility and prompts (beside the blunt rule's),
    queries, and attacker calls with an effect executed over every timing, attack set and approver."""
    out: dict[str, Any] = {}
    for m in modes:
        for c in classifications:
            t: Counter[str] = Counter()
            for r in per_suite.values():
                rc = r.get(c, {}).get(m)
                if rc is None:
                    continue
                t.update({k: v for k, v in rc.get("clean", {}).items()})
                for timing in timings:
                    if timing not in rc["timings"]:
                        continue
                    per = rc["timings"][timing]
                    for kind in ("agentdojo", "adaptive"):
                        r = per.get(kind, {})
                        t["attack_pairs"] += r.get("pairs", 0)
                        t["attacker_calls_executed"] += r.get("attacker_calls_executed", 0)
                        t["attacker_calls_executed_oracle"] += r.get("attacker_calls_executed_oracle", 0)
                        t["attacks_succeeded"] += r.get("attacks_succeeded", 0) + r.get("attacks_succeeded_oracle", 0)
                        for k in HIDDEN_ATTACK_KEYS:
                            t[k] += r.get(k, 0)
                    for v in per.get("hidden_adaptive", {}).values():
                        t["hidden_adaptive_pairs"] += v["pairs"]
                        t["hidden_adaptive_attacker_calls_executed"] += (v["attacker_calls_executed"]
                                                                         + v["attacker_calls_executed_oracle"])
                        t["hidden_adaptive_label_lost"] += v["label_lost"]
                        t["hidden_adaptive_live_links"] += v.get("live_links", 0)
                        t["hidden_adaptive_payload_delivered"] += v.get("payload_delivered", 0)
            out.setdefault(m, {})[c] = dict(t)
    return out


def _print_totals(totals: dict[str, Any]) -> None:
    print("\ntotals over the suites: utility oracle / deny-all, approval prompts (the blunt rule's), queries, "
          "attacker calls with an effect executed deny-all / oracle (pairs x timings)")
    for m, per in totals.items():
        for c, t in per.items():
            t = {"utility_oracle": "-", "user_tasks": "-", "utility_deny": "-", "approval_prompts": "-",
                 "approval_prompts_no_provenance": "-", "attacker_calls_executed": "-",
                 "attacker_calls_executed_oracle": "-", "attack_pairs": "-", **t}  # a part without clean or attacked runs
            line = (f"{m:<12}{c:<12} utility {t['utility_oracle']}/{t['user_tasks']} oracle, {t['utility_deny']} deny-all;"
                    f" prompts {t['approval_prompts']} ({t['approval_prompts_no_provenance']}); attacker calls executed "
                    f"{t['attacker_calls_executed']} / {t['attacker_calls_executed_oracle']} ({t['attack_pairs']})")
            if m == "hidden":
                line += (f"; before call_if and staging {t.get('approval_prompts_before', '-')} prompts, reviews "
                         f"{t.get('reviews', '-')} ({t.get('staged_changes', '-')} changes)")
                line += (f"; queries {t.get('queries', 0)}; taken over {t.get('model_taken_over', 0)} (deny-all);"
                         f" labels lost {t.get('label_lost', 0)}; adaptive on handles: attacker calls executed "
                         f"{t.get('hidden_adaptive_attacker_calls_executed', 0)} ({t.get('hidden_adaptive_pairs', 0)}),"
                         f" labels lost {t.get('hidden_adaptive_label_lost', 0)}")
            print(line)


if __name__ == "__main__":
    main()
