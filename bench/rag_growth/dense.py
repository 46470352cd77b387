"""How a `best` index grows, SQLite and PostgreSQL side by side:
`python -m bench.rag_growth.dense [--sizes 1000,10000,100000] [--backends sqlite,postgres]`.

For each size (in passages) and backend, in its own process (peak memory is its own): size/10 generated
files of about 1,650 words (10 passages each, seeded), embedded by a cheap deterministic stand-in (a hashed
bag of words in 384 dimensions, like MiniLM's; the real encoder would take hours for 100k passages on
this 2-core machine), then with a `best` index:
  ingest_s / ingest_cpu_s   `Index.ingest(folder)` into a new index (wall, and CPU user + system)
  first_search_s / _cpu_s   the first search after it (it built the neighbour state before the ingest did:
                            builds_in_ingest / builds_in_first_search count the whole builds of it)
  change_s                  one file rewritten and `Index.ingest(file)` (its 10 passages replaced)
  search_after_change_s     the first search after that change
  change_to_answer_s        the two together: what a one-file change costs until the next search answers
                            (each also as CPU seconds, *_cpu_s: the machine is shared, wall time varies)
  later_search_s            the median of 5 searches after that
  peak_mb                   the process's peak resident memory
  disk_mb                   the index directory, or the PostgreSQL schema's tables with their indexes
  reader_first_search_s / _cpu_s  (PostgreSQL) the first search of an Index opened afresh after all that (the
                            process's row cache emptied): a process that did not ingest;
                            reader_peak_mb the process's peak after it
  graph_recall_at_10        the stored neighbour graph of 500 sampled passages against exact search
  dense_recall_at_10        the dense top 10 of 20 queries (HNSW candidates above 50,000) against exact
PostgreSQL: $TETHER_BENCH_POSTGRES (default postgresql://postgres@127.0.0.1:54329/postgres); a
database `tether_bench_rag_growth` ($TETHER_BENCH_DB) is created and dropped. Figures go under `--label` (default `growth`)
in results.json, one row per size, backend and code: `--src before=/path/to/old/src --src after=src`
measures two checkouts side by side in one run (a row already there for the same size, backend and
code is replaced, so a run can add the rows another one lacks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.rag_growth.__main__ import HERE, REPO, WORDS, _peak_mb

PG = os.environ.get("TETHER_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:54329/postgres")
DB = os.environ.get("TETHER_BENCH_DB", "tether_bench_rag_growth")  # (a database of its own per concurrent run)
QUERIES = ["kabana lodilis", "vagurum tecoron", "susenum rofenis", "minee kahola", "tebanum ladilis"]


class HashedBag:
    """A deterministic stand-in encoder: each word hashed to one of 384 dimensions, L2-normalised."""

    name = "hashed-bag-384"
    dim = 384
    def __init__(self) -> None:
        self._slot: dict[str, int] = {}

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.split():
                s = self._slot.get(w)
                if s is None:
                    s = self._slot[w] = int.from_bytes(hashlib.md5(w.encode()).digest()[:4], "little") % self.dim
                out[i, s] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _text(rng: random.Random) -> str:
    # ten paragraphs of ~165 words: the chunker makes ten passages of a file
    return "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(165)) for _ in range(10)) + "\n"


def _disk_mb(location: str) -> float:
    if location.startswith("postgresql://"):
        import psycopg

        base, _, name = location.partition("#")
        with psycopg.connect(base) as conn:
            size = conn.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                                "AND c.relkind IN ('r', 'm')", (f"tether_index_{name}",)).fetchone()[0]
        return round(int(size) / 2**20, 1)
    return round(sum(f.stat().st_size for f in Path(location).rglob("*") if f.is_file()) / 2**20, 1)


def _recalls(idx, rng: random.Random) -> tuple[float, float]:
    from tether.rag._dense import DenseRetriever

    r = idx._retriever
    dense: DenseRetriever = r.dense
    vectors = np.asarray(dense.vectors, dtype=np.float32)
    if not vectors.shape[1]:  # pgvector: the server holds them (read here only to measure the graph)
        vectors = np.asarray(idx._load_vectors().vectors, dtype=np.float32)[idx._slots]
    sample = np.asarray(rng.sample(range(len(vectors)), min(500, len(vectors))))
    sims = vectors[sample] @ vectors.T
    sims[np.arange(len(sample)), sample] = -np.inf
    exact = np.argsort(-sims, axis=1)[:, :10]
    graph = r.graph[sample]
    graph_recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(graph, exact, strict=True)]))
    hits = []
    for _ in range(20):
        q = " ".join(rng.choice(WORDS) for _ in range(3))
        got = {i for i, _ in dense.search(q, 10)}
        ann, dense.ivf = dense.ivf, None  # exact: every passage scored with its windows
        truth = {i for i, _ in dense.search(q, 10)}
        dense.ivf = ann
        hits.append(len(got & truth) / 10)
    return round(graph_recall, 4), round(float(np.mean(hits)), 4)


def one(n: int, backend: str) -> dict:
    """Measure one size and backend in this process (see the module docstring)."""
    from tether.rag._index import Index

    rng = random.Random(n)
    files = max(n // 10, 1)
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "docs"
        for i in range(files):
            sub = docs / f"d{i // 1000:03d}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"f{i:06d}.txt").write_text(_text(rng))
        # (an index name of this process: two source trees measured in one run must not share one)
        location = str(Path(tmp) / "ix") if backend == "sqlite" else f"{PG.rpartition('/')[0]}/{DB}#growth{n}_{os.getpid()}"
        out: dict[str, object] = {"backend": backend, "files": files}
        with Index.open(location, retriever="best", embedder=HashedBag()) as idx:
            w, c = time.perf_counter(), _cpu()
            idx.ingest(docs)
            out["ingest_s"], out["ingest_cpu_s"] = round(time.perf_counter() - w, 2), round(_cpu() - c, 2)
            out["chunks"] = len(idx)
            built = getattr(idx, "neighbour_builds", None)  # (None: code before the counter)
            w, c = time.perf_counter(), _cpu()
            idx.search(QUERIES[0], 10)
            out["first_search_s"], out["first_search_cpu_s"] = round(time.perf_counter() - w, 3), round(_cpu() - c, 3)
            if built is not None:
                out["builds_in_ingest"], out["builds_in_first_search"] = built, idx.neighbour_builds - built
            changed = docs / "d000" / "f000000.txt"
            changed.write_text(_text(rng))
            w, c = time.perf_counter(), _cpu()
            report = idx.ingest(changed)
            out["change_s"], out["change_cpu_s"] = round(time.perf_counter() - w, 3), round(_cpu() - c, 3)
            assert len(report.updated) == 1, report
            w, c = time.perf_counter(), _cpu()
            idx.search(QUERIES[1], 10)
            out["search_after_change_s"] = round(time.perf_counter() - w, 3)
            out["search_after_change_cpu_s"] = round(_cpu() - c, 3)
            out["change_to_answer_s"] = round(float(out["change_s"]) + float(out["search_after_change_s"]), 3)  # type: ignore[arg-type]
            out["change_to_answer_cpu_s"] = round(float(out["change_cpu_s"]) + float(out["search_after_change_cpu_s"]), 3)  # type: ignore[arg-type]
            later = []
            for q in QUERIES[2:] + QUERIES[:2]:
                w = time.perf_counter()
                idx.search(q, 10)
                later.append(time.perf_counter() - w)
            out["later_search_s"] = round(statistics.median(later), 4)
            out["graph_recall_at_10"], out["dense_recall_at_10"] = _recalls(idx, rng)
            if (where := getattr(idx, "dense_path", None)) is not None:
                out["dense_path"] = where
        out["peak_mb"] = _peak_mb()
        out["disk_mb"] = _disk_mb(location)
        if backend == "postgres":  # a process that did not ingest: its cache emptied, it opens and searches once
            from tether.rag import _pg_rows

            _pg_rows._CACHES.clear()
            w, c = time.perf_counter(), _cpu()
            with Index.open(location, embedder=HashedBag()) as reader:
                reader.search(QUERIES[2], 10)
            out["reader_first_search_s"] = round(time.perf_counter() - w, 3)
            out["reader_first_search_cpu_s"] = round(_cpu() - c, 3)
            out["reader_peak_mb"] = _peak_mb()  # (the process's peak, the ingest's included)
        return out


def _database(create: bool) -> None:
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        if create:
            conn.execute(f'CREATE DATABASE "{DB}"')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--src", action="append", default=[],
                    help="LABEL=PATH: a tether source tree to measure (repeatable; default after=./src)")
    ap.add_argument("--label", default="growth")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        n, backend = args.one.split(":")
        print(json.dumps(one(int(n), backend)))
        return
    srcs = [tuple(s.split("=", 1)) for s in args.src] or [("after", str(REPO / "src"))]
    backends = args.backends.split(",")
    if "postgres" in backends:
        _database(create=True)
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            for backend in backends:
                for code, src in srcs:
                    env = {**os.environ, "PYTHONPATH": f"{Path(src).resolve()}{os.pathsep}{REPO}"}
                    done = subprocess.run([sys.executable, "-m", "bench.rag_growth.dense", "--one", f"{n}:{backend}"],
                                          env=env, cwd=REPO, capture_output=True, text=True)
                    if done.returncode:
                        print(done.stderr[-3000:], file=sys.stderr)
                        raise SystemExit(f"{n} passages in {backend} with {code} failed")
                    row = {"passages": n, "code": code, **json.loads(done.stdout.strip().splitlines()[-1])}
                    print(json.dumps(row), flush=True)
                    _save(args, srcs, row)  # each row as it comes: a long run stopped keeps what it measured
    finally:
        if "postgres" in backends:
            _database(create=False)


def _save(args: argparse.Namespace, srcs: list[tuple[str, ...]], row: dict) -> None:
    path = HERE / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    entry = results.get(args.label) or {}
    same = ("passages", "backend", "code")
    rows = [r for r in entry.get("rows", []) if any(r.get(k) != row[k] for k in same)] + [row]
    rows.sort(key=lambda r: (r["passages"], r["backend"], r["code"] != "before", r["code"]))
    srcs_seen = {**entry.get("srcs", {}), **{code: src for code, src in srcs}}
    results[args.label] = {"srcs": srcs_seen, "rows": rows, "embedder": HashedBag.name,
                           "command": f"python -m bench.rag_growth.dense --sizes {args.sizes} --backends "
                                      f"{args.backends} " + " ".join(f"--src {c}={s}" for c, s in srcs)
                                      + f" --label {args.label}"}
    path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
