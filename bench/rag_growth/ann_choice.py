"""Which approximate-neighbour library the index keeps: `python -m bench.rag_growth.ann_choice [--n 100000]`.

For hnswlib, usearch and faiss-cpu (each if installed), on N clustered unit vectors (384 dims, seeded):
build time (one thread, and all threads), one file's change (remove 5 labels, add 5 vectors), save + load
time and bytes, recall@10 of 1,000 queries against exact search, and whether two one-thread builds answer
alike. Figures go under `ann_choice` in bench/rag_growth/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DIM, M, EF_BUILD, EF = 384, 16, 100, 64


def data(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((max(n // 50, 1), DIM)).astype(np.float32)
    x = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    sims = q @ x.T
    return np.argsort(-sims, axis=1)[:, :k]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


def hnswlib_run(x: np.ndarray, q: np.ndarray, threads: int) -> tuple[object, dict]:
    import hnswlib

    ix = hnswlib.Index(space="ip", dim=DIM)
    ix.init_index(max_elements=len(x) + 100, M=M, ef_construction=EF_BUILD, random_seed=0, allow_replace_deleted=True)
    ix.set_num_threads(threads)
    t = time.perf_counter()
    ix.add_items(x, np.arange(len(x)))
    build = time.perf_counter() - t
    ix.set_ef(EF)
    labels, _ = ix.knn_query(q, k=10)
    return ix, {"build_s": build, "found": labels}


def hnswlib_change(ix, x: np.ndarray) -> float:
    t = time.perf_counter()
    for label in range(5):
        ix.mark_deleted(label)
    ix.add_items(x[:5], np.arange(len(x), len(x) + 5), replace_deleted=True)
    return time.perf_counter() - t


def hnswlib_io(ix, path: str) -> tuple[float, int]:
    import hnswlib

    t = time.perf_counter()
    ix.save_index(path)
    back = hnswlib.Index(space="ip", dim=DIM)
    back.load_index(path, allow_replace_deleted=True)
    return time.perf_counter() - t, os.path.getsize(path)


def usearch_run(x: np.ndarray, q: np.ndarray, threads: int) -> tuple[object, dict]:
    from usearch.index import Index

    ix = Index(ndim=DIM, metric="ip", dtype="f32", connectivity=M, expansion_add=EF_BUILD, expansion_search=EF)
    t = time.perf_counter()
    ix.add(np.arange(len(x)), x, threads=threads)
    build = time.perf_counter() - t
    found = ix.search(q, 10, threads=1).keys
    return ix, {"build_s": build, "found": np.asarray(found)}


def usearch_change(ix, x: np.ndarray) -> float:
    t = time.perf_counter()
    ix.remove(np.arange(5))
    ix.add(np.arange(len(x), len(x) + 5), x[:5], threads=1)
    return time.perf_counter() - t


def usearch_io(ix, path: str) -> tuple[float, int]:
    from usearch.index import Index

    t = time.perf_counter()
    ix.save(path)
    Index.restore(path)
    return time.perf_counter() - t, os.path.getsize(path)


def faiss_run(x: np.ndarray, q: np.ndarray, threads: int) -> tuple[object, dict]:
    import faiss

    faiss.omp_set_num_threads(threads)
    ix = faiss.IndexHNSWFlat(DIM, M, faiss.METRIC_INNER_PRODUCT)
    ix.hnsw.efConstruction = EF_BUILD
    t = time.perf_counter()
    ix.add(x)
    build = time.perf_counter() - t
    ix.hnsw.efSearch = EF
    _, found = ix.search(q, 10)
    return ix, {"build_s": build, "found": found}


def faiss_change(ix, x: np.ndarray) -> float | None:
    return None  # IndexHNSWFlat cannot remove vectors (remove_ids is unsupported): a change rebuilds


def faiss_io(ix, path: str) -> tuple[float, int]:
    import faiss

    t = time.perf_counter()
    faiss.write_index(ix, path)
    faiss.read_index(path)
    return time.perf_counter() - t, os.path.getsize(path)


LIBS = {"hnswlib": (hnswlib_run, hnswlib_change, hnswlib_io), "usearch": (usearch_run, usearch_change, usearch_io),
        "faiss-cpu": (faiss_run, faiss_change, faiss_io)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--libs", default=",".join(LIBS))
    args = ap.parse_args()
    x = data(args.n)
    q = data(args.n + 1000)[-1000:]
    truth = exact(x, q, 10)
    out: dict[str, dict] = {}
    for name in args.libs.split(","):
        run, change, io = LIBS[name]
        try:
            ix, one = run(x, q, 1)
        except ImportError:
            continue
        _, again = run(x[:5000], q, 1)
        _, again2 = run(x[:5000], q, 1)
        _, many = run(x, q, os.cpu_count() or 1)
        with tempfile.TemporaryDirectory() as tmp:
            io_s, size = io(ix, f"{tmp}/ix")
        change_s = change(ix, x)
        out[name] = {"n": args.n, "build_1thread_s": round(one["build_s"], 2),
                     f"build_{os.cpu_count()}threads_s": round(many["build_s"], 2),
                     "recall_at_10": round(recall(one["found"], truth), 4),
                     "one_file_change_s": None if change_s is None else round(change_s, 4),
                     "save_load_s": round(io_s, 3), "bytes": size,
                     "deterministic_1thread": bool(np.array_equal(again["found"], again2["found"]))}
        print(name, json.dumps(out[name]), flush=True)
    path = HERE / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results["ann_choice"] = {"rows": out, "command": f"python -m bench.rag_growth.ann_choice --n {args.n}"}
    path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
