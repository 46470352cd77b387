"""The first ingest of each development collection: `python -m bench.retrieval.ingest [--base REV]`.

What a new user meets: an empty index, an empty model cache, then every document added through
`Index.add_texts` (the path `tether ingest` takes, default chunking) and the first search (BM25
fitted, neighbour graph built). Each collection runs in its own process so its peak memory is its
own; CPU seconds count every thread (user + system). After the timed part, `best`'s nDCG@10 is
measured through the same index (`evaluate_index`, which finds every document unchanged).

`--base REV` runs the same measurement on the code of another commit (a temporary worktree) in the
same run, so the two sets of figures share the machine's load. Writes `ingest` (and `ingest_base`)
into bench/retrieval/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COLLECTIONS = ("cisi", "cacm", "med")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def one(name: str, data: Path) -> dict:
    """Measure the first ingest of collection `name` in this process (see the module docstring)."""
    from tether.rag._evaluate import evaluate_index, load_collection
    from tether.rag._index import Index

    d = data / name
    col = load_collection(d / "corpus.jsonl", d / "queries.jsonl", d / "qrels.tsv")
    first_query = next(q for q in col.queries if q in col.qrels)
    with tempfile.TemporaryDirectory() as tmp:
        cpu, wall = _cpu(), time.perf_counter()
        with Index(Path(tmp) / "ix") as idx:
            idx.add_texts(zip(col.doc_ids, col.doc_texts, strict=True), markdown=False)
            idx.search(col.queries[first_query], 10)
            cpu, wall = _cpu() - cpu, time.perf_counter() - wall
            peak = _peak_rss_mb()
            chunks = len(idx)
            stored = idx._load_vectors(chunks)  # a bench may look inside
            windows = len(stored.windows) if stored is not None else 0
            embedder = idx.embedder.name
            quality = evaluate_index(idx, col)
    return {"collection": name, "documents": len(col.doc_ids), "chunks": chunks, "windows": windows,
            "embedder": embedder, "cpu_seconds": round(cpu, 1), "wall_seconds": round(wall, 1),
            "documents_per_cpu_second": round(len(col.doc_ids) / cpu, 1),
            "windows_per_cpu_second": round(windows / cpu, 1), "peak_rss_mb": peak,
            "ndcg@10": round(quality["ndcg@10"], 4), "load_average_1m": round(os.getloadavg()[0], 2)}


def run(src: Path, names: list[str], data: Path) -> list[dict]:
    """Each collection in a child process importing tether from `src`, with a fresh model cache."""
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{REPO}", "TETHER_CACHE": cache,
                   "OPENBLAS_NUM_THREADS": "1"}
            env.pop("TETHER_EMBED_MODEL", None)
            out = subprocess.run([sys.executable, "-m", "bench.retrieval.ingest", "--one", name, "--data", str(data)],
                                 env=env, cwd=REPO, capture_output=True, text=True, check=False)
            if out.returncode:
                raise SystemExit(f"{name} under {src}: {out.stderr.strip()[-2000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", default=",".join(COLLECTIONS))
    ap.add_argument("--base", help="also measure this commit's code, in the same run")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.data is None:  # (a child gets --data: it must not import the bench's other modules,
        from bench.retrieval.__main__ import data_dir  # which may need newer code than it runs)

        args.data = data_dir()
    data = args.data
    if args.one:
        print(json.dumps(one(args.one, data)))
        return 0
    names = [n for n in args.collections.split(",") if n]
    results = {"ingest": run(REPO / "src", names, data)}
    if args.base:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "base"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.base],
                           check=True, capture_output=True)
            try:
                rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], check=True,
                                     capture_output=True, text=True).stdout.strip()
                results["ingest_base"] = {"commit": rev, "rows": run(tree / "src", names, data)}
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        base = {r["collection"]: r for r in results["ingest_base"]["rows"]}
        results["ingest_ratio"] = {
            r["collection"]: {"cpu_seconds": round(r["cpu_seconds"] / base[r["collection"]]["cpu_seconds"], 3),
                              "peak_rss_mb": round(r["peak_rss_mb"] / base[r["collection"]]["peak_rss_mb"], 3),
                              "ndcg@10_change": round(r["ndcg@10"] - base[r["collection"]]["ndcg@10"], 4)}
            for r in results["ingest"]}
    path = HERE / "results.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored.update(results)
    stored["ingest_bars"] = {
        f"first ingest of {r['collection']} ({r['documents']} documents) <= 60 CPU s": r["cpu_seconds"] <= 60
        for r in results["ingest"] if r["documents"] >= 1000} | {
        f"peak memory of {r['collection']}'s first ingest <= 400 MB": r["peak_rss_mb"] <= 400 for r in results["ingest"]}
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps({k: stored[k] for k in ("ingest_ratio", "ingest_bars") if k in stored}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
