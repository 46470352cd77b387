"""`python -m bench.agentdojo.merge --into bench/agentdojo/results.json PART.json...`: a bench run in parts
(`python -m bench.agentdojo --suites S --classifications C --modes M --out PART.json`, several processes
at once on a busy machine) written into one results file: each part's modes replace or add to the
file's, suite by suite and classification by classification (timings add up); `runs` lists the part
each figure comes from, and the totals over the suites are recomputed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.agentdojo.__main__ import _print_totals, update


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", required=True, help="the results file to update (written in place)")
    ap.add_argument("parts", nargs="+", help="results files of the parts")
    args = ap.parse_args()
    merged = json.loads(Path(args.into).read_text())
    for part in args.parts:
        new = json.loads(Path(part).read_text())
        runs = new.get("runs", {})
        run = next(iter(runs.values())) if runs else {"modes": [], "seconds": new.get("seconds")}
        merged = update(merged, new, {**run, "part": Path(part).name})
    Path(args.into).write_text(json.dumps(merged, indent=2) + "\n")
    _print_totals(merged["totals"])
    print(f"wrote {args.into}")


if __name__ == "__main__":
    main()
