"""The safety filter on a hand-labelled set: `python -m bench.safety_filter`.

`requests.jsonl` (78 requests a user might send: 50 benign coding, ops and general requests, many
saying "ignore", "password", "delete", "system prompt", "developer mode" for good reasons; 28
injections and jailbreaks) and `answers.jsonl` (47 final answers: 30 benign, 17 leaking a secret,
sending data out, revealing the prompt, speaking as a jailbroken persona or suggesting a command that
wipes a system). Each line: label (1 should be flagged), kind, text. Labelled by hand by whoever wrote
the rules, so the rates are optimistic: read the misses and false alarms it prints, not just the rates.

`heldout_requests.jsonl` (30: 20 benign, 10 attacks) and `heldout_answers.jsonl` (20: 10 and 10) were
written after the weights were set on the first two files and never tuned on: their rates are the
fairer figure.

For each strictness: true and false positive rates of the shipped rules (`input_filter` on requests,
`output_filter` on answers), with the texts behind each false positive and miss. Then the cost of one
check in microseconds: uncached (every rule runs) and cached (a hit), per text, on this machine.
Figures go to bench/safety_filter/results.json.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from tether.policy import SafetyFilter, VerdictCache, input_filter, output_filter
from tether.policy._safety_filter import THRESHOLDS

HERE = Path(__file__).parent
REPEATS = 200


def load(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (HERE / name).read_text("utf-8").splitlines() if line.strip()]


def rates(flt: SafetyFilter, rows: list[dict[str, Any]]) -> dict[str, Any]:
    pos = [r for r in rows if r["label"] == 1]
    neg = [r for r in rows if r["label"] == 0]
    flagged = {id(r): flt.check(r["text"]).flagged for r in rows}
    tp = sum(flagged[id(r)] for r in pos)
    fp = sum(flagged[id(r)] for r in neg)
    return {
        "threshold": flt.threshold, "positives": len(pos), "negatives": len(neg),
        "tpr": round(tp / len(pos), 3), "fpr": round(fp / len(neg), 3), "true_positives": tp, "false_positives": fp,
        "false_positive_texts": [r["text"] for r in neg if flagged[id(r)]],
        "missed": [f"[{r['kind']}] {r['text']}" for r in pos if not flagged[id(r)]],
    }


def micros(make: Any, rows: list[dict[str, Any]], *, cached: bool) -> dict[str, float]:
    per_text = []
    for r in rows:
        flt: SafetyFilter = make()
        if cached:
            flt.check(r["text"])
        start = time.perf_counter_ns()
        for _ in range(REPEATS):
            flt.check(r["text"])
        per_text.append((time.perf_counter_ns() - start) / REPEATS / 1000)
    return {"mean": round(statistics.fmean(per_text), 2), "median": round(statistics.median(per_text), 2),
            "max": round(max(per_text), 2)}


def main() -> None:
    requests, answers = load("requests.jsonl"), load("answers.jsonl")
    sets = {"requests": requests, "answers": answers, "heldout_requests": load("heldout_requests.jsonl"),
            "heldout_answers": load("heldout_answers.jsonl")}
    out: dict[str, Any] = {"method": __doc__.strip().splitlines()[0] if __doc__ else "", "machine": platform.machine(),
                           "python": platform.python_version()}
    for name, rows in sets.items():
        make = input_filter if name.endswith("requests") else output_filter
        out[name] = {s: rates(make(s), rows) for s in THRESHOLDS}  # type: ignore[arg-type]
    from tether.policy import INPUT_RULES, OUTPUT_RULES

    out["microseconds_per_check"] = {
        "input_uncached": micros(lambda: SafetyFilter(INPUT_RULES, cache=VerdictCache(0)), requests, cached=False),
        "input_cached": micros(lambda: SafetyFilter(INPUT_RULES, cache=VerdictCache(64)), requests, cached=True),
        "output_uncached": micros(lambda: SafetyFilter(OUTPUT_RULES, cache=VerdictCache(0)), answers, cached=False),
        "output_cached": micros(lambda: SafetyFilter(OUTPUT_RULES, cache=VerdictCache(64)), answers, cached=True),
        "repeats_per_text": REPEATS,
    }
    (HERE / "results.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"{'set':17} {'strictness':10} {'TPR':>6} {'FPR':>6}")
    for side in sets:
        for strictness, r in out[side].items():
            print(f"{side:17} {strictness:10} {r['tpr']:6.3f} {r['fpr']:6.3f}  ({r['true_positives']}/{r['positives']}, "
                  f"{r['false_positives']}/{r['negatives']})")
    for name, m in out["microseconds_per_check"].items():
        if isinstance(m, dict):
            print(f"{name:16} {m['mean']:8.2f} us mean, {m['median']:8.2f} median, {m['max']:8.2f} max")
    print("written to", HERE / "results.json")


if __name__ == "__main__":
    main()
