"""IVF against brute force on 100,000 vectors derived from a collection's (noisy copies):
`python -m bench.retrieval.ann` (uses the cached CISI vectors)."""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json
import time

import numpy as np

from tether.rag._ann import IVFIndex


def best_of(repeats: int, fn) -> float:
    """The fastest of `repeats` runs of `fn`, in seconds (timings on a shared machine are noisy)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def ann_check(vectors: np.ndarray, queries: np.ndarray, n: int = 100_000, seed: int = 0) -> list[dict]:
    """Recall@10 of IVF against brute force on `n` vectors derived from CISI (noisy copies)."""
    rng = np.random.default_rng(seed)
    base = vectors[rng.integers(0, len(vectors), n)]
    noisy = base + rng.normal(0, 0.6 / np.sqrt(vectors.shape[1]), base.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    start = time.perf_counter()
    ivf = IVFIndex.build(noisy)
    build = time.perf_counter() - start
    truth = [set(np.argsort(-(noisy @ q))[:10]) for q in queries]
    brute_qps = len(queries) / best_of(3, lambda: [np.argsort(-(noisy @ q))[:10] for q in queries])
    rows = []
    for nprobe in (4, 8, 16, 32):
        ivf.nprobe = nprobe

        def search_all() -> list[set[int]]:
            out = []
            for q in queries:
                cand = ivf.candidates(q)
                out.append(set(cand[np.argsort(-(noisy[cand] @ q))[:10]]))
            return out

        found = search_all()
        qps = len(queries) / best_of(3, search_all)
        recall = float(np.mean([len(a & b) / 10 for a, b in zip(found, truth, strict=True)]))
        rows.append({"vectors": n, "nlist": len(ivf.centroids), "nprobe": nprobe, "recall@10": round(recall, 4),
                     "ivf_qps": round(qps, 1), "brute_qps": round(brute_qps, 1), "build_seconds": round(build, 2)})
    return rows


def main() -> int:
    from bench.retrieval.__main__ import data_dir
    from bench.retrieval.embed_cache import collection_vectors
    from tether.rag._dense import DenseRetriever
    from tether.rag._encoder import MiniLMEncoder
    from tether.rag._evaluate import load_collection

    d = data_dir() / "cisi"
    col = load_collection(d / "corpus.jsonl", d / "queries.jsonl", d / "qrels.tsv")
    v = collection_vectors("cisi", col, DenseRetriever(MiniLMEncoder(), window=0))
    rows = ann_check(v.docs, v.queries)
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
