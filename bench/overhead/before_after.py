"""The overhead bench on two versions of tether, alternating processes on the same machine.

    python -m bench.overhead.before_after [BASE_REV] [--rounds N]     # default: main, 3 rounds

The base revision's `src/` is exported with `git archive` to a temporary directory; each round runs
`python -m bench.overhead` once with the base on PYTHONPATH and once with this checkout's `src/`
(the bench code itself is this checkout's in both). Every figure is CPU time (process time: a busy
machine inflates it less than wall time). Prints the median per figure and the ratio, and each
round's ratio (base and this ran back to back, so their spread is the noise); the figures go into
`bench/overhead/results.json` under "before_after" (each repetition's ratios under
"before_after_history", runs against every base kept), beside the last run of this tree's own. A second
measure, independent of the machine's load: function calls per turn (Python and C, counted by a
`sys.setprofile` hook over one 50-step run, async tool); it is deterministic, so a call a change adds
to every step shows up exactly (work without calls, such as an attribute test, does not).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).with_name("results.json")
FIGURES = ("minimal 20-line loop, CPU us/turn", "tether, all guards, async tool, CPU us/turn",
           "tether, all guards, sync tool (threads), CPU us/turn", "tether / minimal (async tool)",
           "us/turn at 10 steps", "us/turn at 150 steps", "50 KB outputs: CPU ms per step (untrusted)")
ROUNDS = 3


def run_bench(src: Path) -> dict[str, float]:
    env = os.environ | {"PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-m", "bench.overhead"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout
    figures = {}
    for name in FIGURES:
        match = re.search(re.escape(name) + r"\s+([\d,.]+)", out)
        if match:
            figures[name] = float(match.group(1).replace(",", ""))
    return figures


CALLS = """
import sys
from bench.overhead.__main__ import lookup, tether_runner
_, run = tether_runner(50, [lookup], "lookup")
run(1)
calls = 0
def count(frame, event, arg):
    global calls
    if event in ("call", "c_call"):
        calls += 1
sys.setprofile(count)
run(1)
sys.setprofile(None)
print(calls / 51)
"""


def calls_per_turn(src: Path) -> float:
    env = os.environ | {"PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CALLS], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    return float(out.split()[-1])


def main() -> int:
    args = sys.argv[1:]
    rounds = ROUNDS
    if "--rounds" in args:
        at = args.index("--rounds")
        rounds = int(args[at + 1])
        del args[at:at + 2]
    base = args[0] if args else "main"
    saved = RESULTS.read_bytes() if RESULTS.exists() else None
    archive = subprocess.run(["git", "archive", base, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fileobj=BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            calls = calls_per_turn(Path(tmp) / "src"), calls_per_turn(ROOT / "src")
            for _ in range(rounds):
                runs["base"].append(run_bench(Path(tmp) / "src"))
                runs["this"].append(run_bench(ROOT / "src"))  # last: results.json is this tree's run
    except BaseException:
        if saved is not None:
            RESULTS.write_bytes(saved)
        raise
    print(f"median of {rounds} alternating runs each; base = {base}; CPU time")
    print(f"{'figure':<55} {'base':>9} {'this':>9} {'this/base':>9}  each round's this/base")
    figures: dict[str, dict[str, object]] = {}
    for name in FIGURES:
        b = statistics.median(r[name] for r in runs["base"])
        t = statistics.median(r[name] for r in runs["this"])
        each = [round(rt[name] / rb[name], 3) for rb, rt in zip(runs["base"], runs["this"], strict=True)]
        print(f"{name:<55} {b:>9.2f} {t:>9.2f} {t / b:>9.2f}  {' '.join(f'{x:.2f}' for x in each)}")
        figures[name] = {"base": [r[name] for r in runs["base"]], "this": [r[name] for r in runs["this"]],
                         "base_median": b, "this_median": t, "ratio": round(t / b, 3), "round_ratios": each}
    print(f"{'function calls per turn (sys.setprofile, exact)':<55} {calls[0]:>9.2f} {calls[1]:>9.2f} "
          f"{calls[1] / calls[0]:>9.2f}")
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # (this tree's last run wrote it anew)
    earlier = json.loads(saved).get("before_after_history", []) if saved else []
    results["before_after"] = {
        "command": "python -m bench.overhead.before_after " + " ".join(sys.argv[1:]), "base": base,
        "rounds": rounds, "cpu": "process time", "figures": figures,
        "calls_per_turn": {"base": calls[0], "this": calls[1], "ratio": round(calls[1] / calls[0], 3)},
    }
    # each repetition's ratios, kept (with its tree's commit), so the spread between runs shows too
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    history = list(earlier)  # every earlier run kept, whatever its base (each names its own)
    history.append({"base": base, "this": head, "ratios": {n: f["ratio"] for n, f in figures.items()},
                    "round_ratios": {n: f["round_ratios"] for n, f in figures.items()}})
    results["before_after_history"] = history
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS} (before_after, before_after_history: {len(history)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
