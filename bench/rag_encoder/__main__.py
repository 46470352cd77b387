"""Which int8 recipe of the MiniLM encoder keeps retrieval quality: `python -m bench.rag_encoder`.

For the float graph (the shipped one) and each candidate recipe (tether.rag._int8), on each
development collection ({cisi,cacm,med} under $TETHER_DATA_DIR or <repo>/../shared/data): the
documents, windows and judged queries are embedded (cached as bench.retrieval caches them), then
dense, the bm25 + MiniLM RRF baseline (`hybrid`) and `best` (shipped settings) are scored per query.

Honest split: the judged queries of each collection are cut in two by position (even = tune, odd =
held out). A recipe is chosen on the tune halves only: the cheapest (CPU seconds per embedded text,
measured here) whose `best` nDCG@10 is at least the float graph's on every collection's tune half.
Figures on the held-out halves are reported for that choice and were not looked at to make it.
(`best`'s own settings were tuned earlier on all queries of these collections: only the encoder
choice is held out here.) Also: cosine of every document vector to the float graph's. Writes
bench/rag_encoder/results.json.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import platform
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

from bench.rag_encoder import stdlib_docs
from bench.retrieval.__main__ import QueryCache, data_dir, dense_for
from bench.retrieval.embed_cache import cache_dir, collection_vectors, judged_ids
from tether.rag import _encoder_path as _path
from tether.rag import _int8 as int8
from tether.rag._dense import DenseRetriever
from tether.rag._encoder import MiniLMEncoder, file_digest, find_model_file
from tether.rag._evaluate import Collection, load_collection, run_queries
from tether.rag._fusion import HybridRetriever
from tether.rag._lexical import BM25Retriever
from tether.rag._metrics import ndcg_at_k
from tether.rag._settings import BEST, best_retriever

HERE = Path(__file__).resolve().parent
COLLECTIONS = ("cisi", "cacm", "med", "stdlib")
DEV = ("cisi", "cacm", "med")  # tether's settings were tuned on all their queries; stdlib was never looked at
CANDIDATES = {
    "int8, 8-bit inputs per token (shipped where exact: VNNI, AMX)": _path.ROW8,
    "int8, 7-bit inputs per token (shipped where 8-bit saturates)": _path.ROW7,
    "int8 all, one input scale per call (shipped before)": int8.Recipe("i8all"),
}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def graph(recipe: int8.Recipe | None) -> Path:
    source = find_model_file()
    if recipe is None:
        return source
    target = cache_dir() / "graphs" / f"minilm-{recipe.name}-{file_digest(source)}.onnx"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        recipe.rewrite(source, target)
    return target


def per_query(retriever, col: Collection) -> np.ndarray:
    runs = run_queries(retriever, col)
    return np.array([ndcg_at_k(runs[q], col.qrels[q], 10) for q in judged_ids(col)])


def speed(path: Path, texts: list[str]) -> float:
    """CPU seconds per text, one thread, on a fixed sample (after a warm-up call)."""
    enc = MiniLMEncoder(path, threads=1)
    enc.embed(texts[:4])
    t = _cpu()
    enc.embed(texts)
    return (_cpu() - t) / len(texts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", default=",".join(COLLECTIONS))
    ap.add_argument("--candidates", default=",".join(c.name for c in CANDIDATES.values()))
    ap.add_argument("--embed-only", action="store_true",
                    help="only fill the vector cache for --candidates ('float' names the shipped graph)")
    args = ap.parse_args(argv)
    names = [n for n in args.collections.split(",") if n]
    wanted = set(args.candidates.split(","))
    recipes: dict[str, int8.Recipe | None] = {"float (shipped graph)": None} | {
        label: r for label, r in CANDIDATES.items() if r.name in wanted}
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    root = data_dir()
    cols = {n: stdlib_docs.build() if n == "stdlib" else
            load_collection(root / n / "corpus.jsonl", root / n / "queries.jsonl", root / n / "qrels.tsv") for n in names}
    if args.embed_only:  # (several of these can run side by side; the full run then reads the cache)
        for label, recipe in recipes.items():
            if recipe is not None or "float" in wanted:
                enc = MiniLMEncoder(graph(recipe))
                for n in names:
                    collection_vectors(n, cols[n], DenseRetriever(enc, window=126, stride=63), pooled_only=True)
                    log(f"{label} / {n}: cached")
        return 0
    sample = [t for n in names for t in cols[n].doc_texts[:: max(1, len(cols[n].doc_texts) // 40)][:40]]
    report: dict = {"recipes": {}, "collections": {}}
    scores: dict[str, dict[str, dict[str, np.ndarray]]] = {}  # recipe -> collection -> retriever -> per query
    float_docs: dict[str, np.ndarray] = {}
    float_queries: dict[str, np.ndarray] = {}
    for label, recipe in recipes.items():
        path = graph(recipe)
        enc = MiniLMEncoder(path)
        report["recipes"][label] = {
            "recipe": None if recipe is None else {"name": recipe.name, "unsigned": recipe.unsigned,
                                                   "keep_float": sorted(recipe.keep_float)},
            "cpu_seconds_per_text": round(speed(path, sample), 5)}
        scores[label] = {}
        for n in names:
            col = cols[n]
            t = time.perf_counter()
            v = collection_vectors(n, col, DenseRetriever(enc, window=126, stride=63), pooled_only=True)
            log(f"{label} / {n}: vectors in {time.perf_counter() - t:.0f} s (cached: {v.from_cache})")
            qids = judged_ids(col)
            emb = QueryCache(enc, [col.queries[q] for q in qids], v.queries)
            bm = BM25Retriever()
            bm.fit(col.doc_texts)
            dense = dense_for(emb, v, BEST.window)
            best = best_retriever(BEST, dense=dense_for(emb, v, BEST.window))
            best.lexical.fit(col.doc_texts)
            best.prepare()
            scores[label][n] = {"dense": per_query(dense, col), "hybrid": per_query(HybridRetriever([bm, dense]), col),
                                "best": per_query(best, col)}
            if recipe is None:
                float_docs[n], float_queries[n] = v.docs, v.queries
            else:  # the same documents, queries embedded by the float graph (short: cheap at search time)
                emb_f = QueryCache(enc, [col.queries[q] for q in qids], float_queries[n])
                mixed = best_retriever(BEST, dense=dense_for(emb_f, v, BEST.window))
                mixed.lexical.fit(col.doc_texts)
                mixed.prepare()
                scores.setdefault(f"{label} + float queries", {})[n] = {
                    "dense": per_query(dense_for(emb_f, v, BEST.window), col),
                    "hybrid": per_query(HybridRetriever([bm, dense_for(emb_f, v, BEST.window)]), col),
                    "best": per_query(mixed, col)}
                cos = (v.docs * float_docs[n]).sum(axis=1) if n in float_docs else np.array([np.nan])
                report["recipes"][label].setdefault("cosine_to_float", {})[n] = {
                    "min": round(float(cos.min()), 4), "mean": round(float(cos.mean()), 5)}
    halves = {"tune": slice(0, None, 2), "held_out": slice(1, None, 2), "all": slice(None)}
    for n in names:
        report["collections"][n] = {
            label: {part: {r: round(float(s[r][cut].mean()), 4) for r in ("dense", "hybrid", "best")}
                    for part, cut in halves.items()}
            for label, per in scores.items() for s in [per[n]]}
    ref = "float (shipped graph)"
    ok = [label for label in recipes if label != ref and label in scores and all(
        scores[label][n]["best"][halves["tune"]].mean() >= scores[ref][n]["best"][halves["tune"]].mean() for n in names)]
    chosen = min(ok, key=lambda lb: report["recipes"][lb]["cpu_seconds_per_text"]) if ok else ref
    report["choice"] = {
        "rule": "cheapest recipe whose best nDCG@10 on every collection's tune half >= the float graph's",
        "chosen": chosen, "passing": ok,
        "held_out": {n: {"chosen best": report["collections"][n][chosen]["held_out"]["best"],
                         "float best": report["collections"][n][ref]["held_out"]["best"],
                         "float hybrid (bm25 + MiniLM RRF)": report["collections"][n][ref]["held_out"]["hybrid"]}
                     for n in names}}
    report["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "cpu_flags": sorted(set(re.findall(r"\b(avx2|avx512f|avx512_vnni|avx_vnni|amx_int8)\b",
                                                            Path("/proc/cpuinfo").read_text()))),
                         "load_average_1m": round(os.getloadavg()[0], 2)}
    out = HERE / "results.json"
    stored = json.loads(out.read_text()) if out.exists() else {}
    stored.update(report)
    out.write_text(json.dumps(stored, indent=2) + "\n")
    for n in names:
        print(n)
        for label in scores:
            row = report["collections"][n][label]
            print(f"  {label:<46} " + "  ".join(f"{part} " + " ".join(f"{r} {row[part][r]:.4f}" for r in row[part])
                                               for part in ("tune", "held_out")))
    print(json.dumps(report["choice"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
