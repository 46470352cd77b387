"""The durable checkpoint cost on two versions of tether, alternating processes on one machine.

    python -m bench.durable.before_after [BASE_REV] [ROUNDS]     # default: main, 3

Like bench.overhead.before_after: the base revision's `src/` is exported with `git archive`; each
round measures once with the base on PYTHONPATH and once with this checkout's `src/`, in separate
processes, for DBOS as shipped (`TETHER_DBOS_FASTPATH=0`) and with tether's fast path
(`TETHER_DBOS_FASTPATH=1`): both versions read the variable the same way, whatever their default.
A figure is bench.durable's: (durable wall or CPU time - in-memory time) / DBOS steps, SQLite WAL,
median of its repetitions; printed as the median of the rounds, side by side, with the ratio.
bench/durable/results.json is not touched.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 3

MEASURE = """
import json, sys, tempfile
from pathlib import Path
import bench.durable.__main__ as b
from tether.durable import teardown
memory, memory_cpu = b.time_memory()
where = str(Path(tempfile.mkdtemp()) / "bench.db")
try:
    wall, cpu = b._medians(b._agent("bench", durable=where))
finally:
    teardown()
steps = b.RUNS * (2 * b.TURNS + 1)
print(json.dumps({"ms/step": (wall - memory) * 1000 / steps, "cpu ms/step": (cpu - memory_cpu) * 1000 / steps,
                  "in-memory ms/turn": memory * 1000 / (b.RUNS * (b.TURNS + 1))}))
"""


def measure(src: Path, fastpath: bool) -> dict[str, float]:
    env = os.environ | {"PYTHONPATH": f"{src}{os.pathsep}{ROOT}", "TETHER_DBOS_FASTPATH": "1" if fastpath else "0"}
    out = subprocess.run([sys.executable, "-c", MEASURE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "main"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else ROUNDS
    archive = subprocess.run(["git", "archive", base, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    runs: dict[tuple[str, bool], list[dict[str, float]]] = {(v, f): [] for v in ("base", "this") for f in (False, True)}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        for _ in range(rounds):
            for fastpath in (False, True):
                runs[("base", fastpath)].append(measure(Path(tmp) / "src", fastpath))
                runs[("this", fastpath)].append(measure(ROOT / "src", fastpath))
    print(f"median of {rounds} alternating runs each; base = {base}; SQLite WAL; load {os.getloadavg()[0]:.2f}")
    print(f"{'figure':<40} {'base':>9} {'this':>9} {'this/base':>9}")
    for fastpath in (False, True):
        for name in ("ms/step", "cpu ms/step", "in-memory ms/turn"):
            b = statistics.median(r[name] for r in runs[("base", fastpath)])
            t = statistics.median(r[name] for r in runs[("this", fastpath)])
            label = f"{name} ({'fast path' if fastpath else 'DBOS as shipped'})"
            print(f"{label:<40} {b:>9.3f} {t:>9.3f} {t / b:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
