"""A new user's first run, measured: a fresh clone, `scripts/bootstrap` with an empty pip cache,
then the README's first command. Seconds per phase and the load average while it ran.

    python -m bench.setup                  # clones this repository's HEAD; writes bench/setup/results.json
    python -m bench.setup --label "under load"   # another run beside it (results.json keeps one per label)

Bar (issue 22): at most 2 minutes to the first answer on an idle 2-core machine; the figure under
load is reported beside it (the load average is sampled every second).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST = [".venv/bin/tether", "--tools", "calculator", "-p", "What is 17 * 23?"]


def main() -> int:
    label = sys.argv[sys.argv.index("--label") + 1] if "--label" in sys.argv else "idle"
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample, daemon=True).start()
    phases: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="tether-setup-") as tmp:
        clone = Path(tmp) / "tether"
        t0 = time.monotonic()
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        phases.append({"phase": "git clone", "seconds": round(time.monotonic() - t0, 2)})
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
        env.pop("VIRTUAL_ENV", None)
        t1 = time.monotonic()
        proc = subprocess.Popen(["scripts/bootstrap"], cwd=clone, env=env, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        marks: list[tuple[str, float]] = []
        for line in proc.stderr:
            sys.stderr.write(line)
            if m := re.match(r"\[bootstrap\] (\d/\d [^(]+)", line):
                marks.append((m.group(1).strip(), time.monotonic()))
        if proc.wait() != 0:
            print("bootstrap failed", file=sys.stderr)
            return 1
        t2 = time.monotonic()
        for (name, start), end in zip(marks, [m[1] for m in marks[1:]] + [t2], strict=True):
            phases.append({"phase": f"bootstrap {name}", "seconds": round(end - start, 2)})
        answer = subprocess.run(FIRST, cwd=clone, capture_output=True, text=True, timeout=600)
        t3 = time.monotonic()
        phases.append({"phase": "first answer (" + " ".join(FIRST[1:]) + ")", "seconds": round(t3 - t2, 2)})
    stop.set()
    out = {
        "total_seconds_to_first_answer": round(t3 - t0, 2),
        "bootstrap_seconds": round(t2 - t1, 2),
        "answer": answer.stdout.strip(),
        "answer_ok": answer.stdout.strip() == "391",
        "phases": phases,
        "load_average": {"min": min(loads, default=0), "max": max(loads, default=0),
                         "mean": round(sum(loads) / len(loads), 2) if loads else 0, "cores": os.cpu_count()},
        "pip_cache": "empty (PIP_NO_CACHE_DIR=1)",
    }
    for p in phases:
        print(f"{p['seconds']:>8.2f} s  {p['phase']}")
    print(f"{out['total_seconds_to_first_answer']:>8.2f} s  total to the first answer ({out['answer']!r}); "
          f"load {out['load_average']['mean']} (max {out['load_average']['max']}) on {os.cpu_count()} cores")
    path = Path(__file__).with_name("results.json")
    runs = json.loads(path.read_text()) if path.exists() else {}
    if "phases" in runs:  # the one-run layout of the first version
        runs = {"idle": runs}
    runs[label] = out
    path.write_text(json.dumps(runs, indent=2) + "\n")
    return 0 if out["answer_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
