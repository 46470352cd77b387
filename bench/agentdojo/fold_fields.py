"""`python -m bench.agentdojo.fold_fields --into bench/agentdojo/results.json --parts DIR`: the per-field runs
(issue 44, `Declares.trusted_fields`) folded into the results file's `ask_fewer`, the figures before kept beside.

DIR holds the per-suite `--out` files of these runs (the committed ones: bench/agentdojo/per_field_runs; the commands are written into `ask_fewer.commands.per_field`):

- `clean_S.json`: `python -m bench.agentdojo --suites S --modes hidden --timings immediate --no-undefended
  --no-attack-utility --injections 0 --out clean_S.json` (workspace, banking, slack; travel declares no field
  and is not re-run: its figures are the same before and after);
- `atk_S.json` (workspace in parts, `atk_workspace_0-20.json`...): `python -m bench.agentdojo --suites S
  [--user-tasks I:J] --modes hidden --timings immediate,after_user,interleaved --no-undefended
  --no-attack-utility --out atk_S.json`;
- `heldout_I-J.json`: `python -m bench.agentdojo.heldout --modes hidden --no-undefended --no-plan-mode
  --no-attack-utility --user-tasks I:J --out heldout_I-J.json`.

What it writes under `ask_fewer`: `clean` (each suite and classification: the new figures, each with
`*_before_fields`), `clean_totals`, `prompt_reasons`; the first fold copies the figures before into
`clean_before_fields`, `clean_totals_before_fields` and `prompt_reasons_before_fields` (a later fold keeps
them, so folding again gives the same file); `attacked_per_field` (one entry a part and classification),
`attacked_per_field_totals`, `heldout_per_field`. `--check` writes nothing and lists the keys that would
change (exit status 1 if any).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

CLASSIFICATIONS = ("bench", "docstrings")
CLEAN_KEYS = ("approval_prompts", "tasks_with_prompts", "utility_oracle", "utility_deny", "queries")
ADAPTIVE_KEYS = ("pairs", "attacker_calls_executed", "attacker_calls_executed_oracle", "label_lost", "live_links")
HELDOUT_KEYS = ("pairs", "attacker_calls_executed", "attacker_calls_executed_oracle", "attacks_succeeded",
                "attacks_succeeded_oracle", "label_lost", "model_taken_over")
# slack `bench` before: 24 prompts, measured on the per-field branch's base (main after small-fixes, the same
# oracle runs); the figure in `clean_before_fields` is the earlier run's 25
BEFORE_OVERRIDES = {("slack", "bench"): (24, "approval_prompts_before_fields: 24 measured on main after small-fixes "
                                             "(25 in clean_before_fields)")}
WHAT = ("per-field labels declared by the service (tether.values._fields, `Declares.trusted_fields`): the service-set "
        "fields of untrusted outputs (bench/agentdojo/effects.py and effects_docstrings.py `FIELDS`) are shown beside "
        "the handle and trusted by handle; the planner uses them where the task selects by them "
        "(hidden_plan.FIELDS_USED). `*_before_fields`: the figures of the run before.")
TOTALS_NOTE = ("workspace, banking, slack re-run (three timings, deny-all and oracle); travel declares no field and "
               "was not re-run (its 780 pairs per classification: 0 / 0 in `attacked`)")
COMMANDS = {
    "clean": "python -m bench.agentdojo --suites S --modes hidden --timings immediate --no-undefended "
             "--no-attack-utility --injections 0 --out clean_S.json",
    "attacked": "python -m bench.agentdojo --suites S [--user-tasks I:J] --modes hidden --timings "
                "immediate,after_user,interleaved --no-undefended --no-attack-utility --out atk_S.json",
    "fold": "python -m bench.agentdojo.fold_fields --into bench/agentdojo/results.json --parts DIR (this report's "
            "figures; travel not re-run: it declares no field)"}
HELDOUT_COMMAND = ("python -m bench.agentdojo.heldout --modes hidden --no-undefended --no-plan-mode "
                   "--no-attack-utility --user-tasks 0:20 (and 20:40)")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def fold_clean(a: dict[str, Any], parts: list[Path]) -> None:
    """The clean runs into `a["clean"]`, `clean_totals` and `prompt_reasons`, each figure beside its figure before."""
    if "clean_before_fields" not in a:
        a["clean_before_fields"] = copy.deepcopy(a["clean"])
        a["clean_totals_before_fields"] = copy.deepcopy(a["clean_totals"])
        a["prompt_reasons_before_fields"] = copy.deepcopy(a["prompt_reasons"])
    for path in parts:
        for suite, v in _load(path)["suites"].items():
            for c in CLASSIFICATIONS:
                x = v[c]["hidden"]
                clean = dict(x["clean"])
                old = a["clean_before_fields"][suite][c]
                for k in CLEAN_KEYS:
                    clean[f"{k}_before_fields"] = old[k]
                clean["oracle_failures"] = x.get("oracle_failures", [])
                a["clean"][suite][c] = clean
                a["prompt_reasons"][suite][c] = x.get("prompt_reasons", {})
    for suite in a["clean"]:  # a suite not re-run: the same figures before and after
        for c in CLASSIFICATIONS:
            for k in CLEAN_KEYS:
                a["clean"][suite][c].setdefault(f"{k}_before_fields", a["clean"][suite][c][k])
    for (suite, c), (before, note) in BEFORE_OVERRIDES.items():
        a["clean"][suite][c]["approval_prompts_before_fields"] = before
        a["clean"][suite][c]["note"] = note
    for c in CLASSIFICATIONS:
        totals: dict[str, int] = {}
        for suite in a["clean"]:
            for k, v in a["clean"][suite][c].items():
                if isinstance(v, int):
                    totals[k] = totals.get(k, 0) + v
        a["clean_totals"][c] = totals


def attacked_part(suite: str, x: dict[str, Any], seconds: Any) -> dict[str, Any]:
    """One attacked part's figures (one classification): its timings' counts added up."""
    out: dict[str, Any] = {"suite": suite, "timings": sorted(x["timings"]), "pairs": 0}
    for tv in x["timings"].values():
        for src in ("agentdojo", "adaptive"):
            for k, val in tv.get(src, {}).items():
                if isinstance(val, int):
                    out[k] = out.get(k, 0) + val
        for vv in tv.get("hidden_adaptive", {}).values():
            h = out.setdefault("hidden_adaptive", {})
            for k in ADAPTIVE_KEYS:
                if isinstance(vv.get(k), int):
                    h[k] = h.get(k, 0) + vv[k]
    out["trusted_tools_that_carried_injections"] = x.get("trusted_tools_that_carried_injections")
    out["seconds"] = seconds
    return out


def fold_attacked(a: dict[str, Any], parts: list[Path]) -> None:
    """The attacked parts into `attacked_per_field` and their sums into `attacked_per_field_totals`."""
    att = a.setdefault("attacked_per_field", {})
    for path in parts:
        new = _load(path)
        for suite, v in new["suites"].items():
            for c in CLASSIFICATIONS:
                att[f"{path.stem}_{c}"] = attacked_part(suite, v[c]["hidden"], new.get("seconds"))
    totals: dict[str, Any] = {}
    for c in CLASSIFICATIONS:
        rows = [r for name, r in att.items() if name.endswith(f"_{c}")]
        t = {k: sum(r.get(k, 0) for r in rows) for k in ADAPTIVE_KEYS}
        t["hidden_adaptive_pairs"] = sum(r.get("hidden_adaptive", {}).get("pairs", 0) for r in rows)
        t["hidden_adaptive_executed"] = sum(r.get("hidden_adaptive", {}).get("attacker_calls_executed", 0)
                                            for r in rows)
        totals[c] = t
    totals["note"] = TOTALS_NOTE
    a["attacked_per_field_totals"] = totals


def fold_heldout(a: dict[str, Any], parts: list[Path]) -> None:
    """The held-out parts, added up, into `heldout_per_field`."""
    out: dict[str, Any] = {"command": HELDOUT_COMMAND}
    for path in parts:
        for c, v in _load(path)["defended"].items():
            t = out.setdefault(c, {**dict.fromkeys(HELDOUT_KEYS, 0), "parts": []})
            for x in v["hidden"].values():
                for k in HELDOUT_KEYS:
                    t[k] += x[k]
            t["parts"].append(path.stem.removeprefix("heldout_"))
    a["heldout_per_field"] = out


def fold(results: dict[str, Any], parts: Path) -> dict[str, Any]:
    """`results` with the runs in `parts` folded into `ask_fewer` (a new dict; `written_per_field` kept when
    no figure changed)."""
    d = copy.deepcopy(results)
    a = d["ask_fewer"]
    clean, atk, held = (sorted(parts.glob(f"{p}_*.json")) for p in ("clean", "atk", "heldout"))
    if not (clean or atk or held):
        raise SystemExit(f"no clean_*.json, atk_*.json or heldout_*.json in {parts}")
    fold_clean(a, clean)
    fold_attacked(a, atk)
    if held:
        fold_heldout(a, held)
    a["what_per_field"] = WHAT
    a.setdefault("commands", {})["per_field"] = COMMANDS
    before = results["ask_fewer"]
    if any(a.get(k) != before.get(k) for k in a if k not in ("written_per_field", "commands")):
        a["written_per_field"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return d


def changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The `ask_fewer` keys whose values differ between `old` and `new`."""
    a, b = old.get("ask_fewer", {}), new.get("ask_fewer", {})
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", required=True, type=Path, help="the results file (written in place)")
    ap.add_argument("--parts", required=True, type=Path, help="the directory of the runs' --out files")
    ap.add_argument("--check", action="store_true", help="write nothing; list the keys that would change")
    args = ap.parse_args()
    old = _load(args.into)
    new = fold(old, args.parts)
    diff = changed(old, new)
    print(f"ask_fewer keys changed: {', '.join(diff) or 'none'}")
    if args.check:
        sys.exit(1 if diff else 0)
    args.into.write_text(json.dumps(new, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.into}")


if __name__ == "__main__":
    main()
