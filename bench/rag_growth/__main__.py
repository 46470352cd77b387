"""How lexical ingest grows with the number of files: `python -m bench.rag_growth [--sizes 1000,5000,20000]`.

For each size, in its own process (so peak memory is its own): N small generated text files (about
60 words each, seeded), then with a `bm25` index
  ingest      `Index.ingest(folder)` into a new index (CPU seconds, user + system)
  search      the first search after it (fits or restores BM25; wall seconds)
  change      one file edited, the folder ingested again (hashes every file, replaces one; CPU s)
  add_one     `Index.ingest(file)` of one new file outside the folder (CPU s)
  search_after  the first search after that change (wall seconds)
  peak_mb     the process's peak resident memory

`--src DIR` measures another checkout's code (e.g. the commit before the change) with the same
files, and `--label NAME` files the figures under that name in bench/rag_growth/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORDS = [f"{a}{b}{c}" for a in ("ka", "lo", "mi", "su", "te", "va", "ro", "ne")
         for b in ("ban", "cor", "dil", "fen", "gur", "hol") for c in ("a", "e", "is", "on", "um")]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(60)) + "\n"


def one(n: int) -> dict:
    """Measure one size in this process (see the module docstring)."""
    from tether.rag._index import Index

    rng = random.Random(n)
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "docs"
        for i in range(n):
            sub = docs / f"d{i // 1000:03d}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"f{i:06d}.txt").write_text(_text(rng))
        out: dict[str, float | int] = {"files": n}
        with Index(Path(tmp) / "ix", retriever="bm25") as idx:
            c = _cpu()
            idx.ingest(docs)
            out["ingest_cpu_s"] = round(_cpu() - c, 3)
            w = time.perf_counter()
            idx.search("kabana lodilis", 10)
            out["search_s"] = round(time.perf_counter() - w, 3)
            (docs / "d000" / "f000000.txt").write_text(_text(rng))
            c = _cpu()
            report = idx.ingest(docs)
            out["change_cpu_s"] = round(_cpu() - c, 3)
            assert len(report.updated) == 1, report
            extra = Path(tmp) / "extra.txt"
            extra.write_text(_text(rng))
            c = _cpu()
            idx.ingest(extra)
            out["add_one_cpu_s"] = round(_cpu() - c, 3)
            w = time.perf_counter()
            idx.search("kabana lodilis", 10)
            out["search_after_s"] = round(time.perf_counter() - w, 3)
            out["chunks"] = len(idx)
        out["peak_mb"] = _peak_mb()
        import tether

        out["tether"] = str(Path(tether.__file__).parents[1])
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000,20000")
    ap.add_argument("--src", type=Path, default=REPO / "src", help="the tether source tree to measure")
    ap.add_argument("--label", default="after")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    env = {**os.environ, "PYTHONPATH": f"{args.src.resolve()}{os.pathsep}{REPO}", "OPENBLAS_NUM_THREADS": "1"}
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        done = subprocess.run([sys.executable, "-m", "bench.rag_growth", "--one", str(n)], env=env, cwd=REPO,
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    path = HERE / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results[args.label] = {"src": str(args.src), "rows": rows,
                           "command": f"python -m bench.rag_growth --sizes {args.sizes} --label {args.label}"}
    path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
