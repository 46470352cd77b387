"""Every retriever on every development collection, and `best` tuned across them:
`python -m bench.retrieval`.

Collections are read from $TETHER_DATA_DIR or <repo>/../shared/data ({cisi,cacm,med}). Dense
vectors (documents, windows, judged queries) are cached under ~/.cache/tether-bench
($TETHER_BENCH_CACHE) keyed by the texts, the model and the window scheme, so reruns never
re-embed; `--no-cache` re-embeds. Prints tables and writes bench/retrieval/results.json.

`--shipped-only` refreshes what the encoder changes for the shipped settings without scoring the
8,640-point grid: every retriever's figures (`collections`, with the encoder the per-CPU decision
picks here), `embedding` and the bars; the grid's choice, leave-one-out and ablation stay as
results.json has them (`grid_scored_with` names the encoder they were scored with).
"""

from __future__ import annotations

import os

# Searches run one query at a time: a matrix-vector product is too small for BLAS threads, whose
# hand-offs cost more than they save on a busy 2-core machine. Must be set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import platform
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bench.retrieval import tuning
from bench.retrieval.embed_cache import Vectors, cache_dir, collection_vectors, judged_ids
from tether.rag._dense import DenseRetriever, knn_graph
from tether.rag._encoder import MiniLMEncoder
from tether.rag._evaluate import Collection, load_collection, queries_per_second, run_queries
from tether.rag._fusion import HybridRetriever
from tether.rag._lexical import BM25Retriever, TfidfRetriever
from tether.rag._metrics import summarize
from tether.rag._settings import BEST, BestSettings, best_retriever

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COLLECTIONS = ("cisi", "cacm", "med")
METRICS = ("ndcg@10", "recall@100", "map")
LOCO_KEPT = "best-loco (grid's encoder, not refreshed)"


def data_dir() -> Path:
    env = os.environ.get("TETHER_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data"


class QueryCache:
    """An embedder that answers the judged queries from the bench cache and embeds anything else,
    so dense rows time scoring rather than re-encoding the same queries."""

    def __init__(self, encoder: MiniLMEncoder, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.encoder, self.name, self.dim = encoder, encoder.name, encoder.dim
        self.known = {t: v for t, v in zip(texts, vectors, strict=True)}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if all(t in self.known for t in texts):
            return np.stack([self.known[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
        return self.encoder.embed(texts)

    def piece_offsets(self, text: str) -> list[tuple[int, int]]:
        return self.encoder.piece_offsets(text)


def grid_key(name: str, col: Collection, model: str, settings: list[BestSettings]) -> str:
    """Per-query grid scores are valid for these texts, queries, judgments, model, grid and the
    code that scores them (the retrievers' and the tuning module's sources)."""
    import hashlib

    import tether.rag._dense
    import tether.rag._fusion
    import tether.rag._lexical
    import tether.rag._text

    h = hashlib.sha256()
    for part in (name, model, repr(settings), json.dumps(col.qrels, sort_keys=True), *col.doc_texts,
                 *(col.queries[q] for q in judged_ids(col))):
        h.update(part.encode() + b"\x1f")
    for mod in (tether.rag._dense, tether.rag._fusion, tether.rag._lexical, tether.rag._text, tuning):
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()[:16]


def settings_json(s: BestSettings) -> dict:
    d = asdict(s)
    return {k: v for k, v in d.items()}


def dense_for(emb: QueryCache, v: Vectors, window: int) -> DenseRetriever:
    d = DenseRetriever(emb, window=window, stride=max(window // 2, 1))
    if window:
        d.set_vectors(v.docs, windows=v.windows, owner=v.owner)
    else:
        d.set_vectors(v.docs)
    return d


def metrics_of(retriever, col: Collection, fit_seconds: float, timed: bool) -> dict:
    out = summarize(run_queries(retriever, col), col.qrels)
    row = {k: round(out[k], 4) for k in ("ndcg@10", "recall@10", "recall@100", "map")}
    row["index_seconds"] = round(fit_seconds, 2)
    if timed:
        queries = [col.queries[q] for q in judged_ids(col)]
        row["queries_per_second"] = round(queries_per_second(retriever, queries), 1)
        # The same searches per second of this process's CPU time: what one core sustains, apart
        # from how much of it a loaded shared machine hands out.
        t = time.process_time()
        for q in queries:
            retriever.search(q, 100)
        row["queries_per_cpu_second"] = round(len(queries) / max(time.process_time() - t, 1e-9), 1)
    return row


def index_cost(name: str) -> dict:
    """`bench.retrieval.index_cost` in its own process (so its peak RSS is the index's alone)."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "bench.retrieval.index_cost", name], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=3600)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def fitted(retriever, texts: list[str]) -> tuple[object, float]:
    t = time.perf_counter()
    retriever.fit(texts)
    return retriever, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Retrievers on every development collection; best tuned across them.")
    parser.add_argument("--no-cache", action="store_true", help="re-embed everything")
    parser.add_argument("--collections", default=",".join(COLLECTIONS))
    parser.add_argument("--shipped-only", action="store_true",
                        help="refresh every retriever's figures with the shipped encoder; keep the grid's")
    args = parser.parse_args(argv)
    names = [n for n in args.collections.split(",") if n]
    root = data_dir()
    missing = [n for n in names if not (root / n / "corpus.jsonl").exists()]
    if missing:
        print(f"collections {', '.join(missing)} not found under {root}; set TETHER_DATA_DIR", file=sys.stderr)
        return 1
    encoder, decision = shipped_encoder() if args.shipped_only else (MiniLMEncoder(), None)
    stored = json.loads((HERE / "results.json").read_text()) if (HERE / "results.json").exists() else {}
    settings = tuning.grid()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    per_query: dict[str, np.ndarray] = {}
    cols: dict[str, Collection] = {}
    vecs: dict[str, Vectors] = {}
    embed_info: dict[str, dict] = {}
    for name in names:
        d = root / name
        col = cols[name] = load_collection(d / "corpus.jsonl", d / "queries.jsonl", d / "qrels.tsv")
        log(f"{name}: {len(col.doc_ids)} documents, {len(judged_ids(col))} judged queries")
        v = collection_vectors(name, col, DenseRetriever(encoder, window=126, stride=63), use_cache=not args.no_cache,
                               pooled_only=args.shipped_only)
        vecs[name] = v
        embed_info[name] = {"documents_seconds": round(v.doc_seconds, 1), "windows_seconds": round(v.window_seconds, 1),
                            "windows": len(v.owner), "from_cache": v.from_cache}
        if args.shipped_only:
            continue
        qids = judged_ids(col)
        emb = QueryCache(encoder, [col.queries[q] for q in qids], v.queries)
        t = time.perf_counter()
        key = grid_key(name, col, encoder.name, settings)
        cached_grid = cache_dir() / f"grid-{key}.npy"
        if not args.no_cache and cached_grid.exists():
            per_query[name] = np.load(cached_grid)
            log(f"  grid of {len(settings)} settings from {cached_grid}")
        else:
            per_query[name] = tuning.score_grid(col, qids, {w: dense_for(emb, v, w) for w in tuning.WINDOWS},
                                                v.queries, settings, log)
            cached_grid.parent.mkdir(parents=True, exist_ok=True)
            np.save(cached_grid, per_query[name])
            log(f"  grid of {len(settings)} settings scored in {time.perf_counter() - t:.0f} s")

    if args.shipped_only:
        chosen = BEST
        loco = stored["leave_one_collection_out"]
    else:
        means = np.stack([per_query[n].mean(axis=1) for n in names])  # collections x settings
        np.save(cache_dir() / "last-grid-means.npy", means)
        pick = tuning.choose(means)
        chosen = settings[pick]
        loco: dict[str, dict] = {}
        for i, held in enumerate(names):
            others = [j for j in range(len(names)) if j != i]
            p = tuning.choose(means[others]) if others else pick
            row = means[i]
            loco[held] = {"settings": settings_json(settings[p]), "ndcg@10": round(float(row[p]), 4),
                          "grid_rank": int((row > row[p]).sum()) + 1, "grid_size": len(settings),
                          "grid_max": round(float(row.max()), 4), "grid_median": round(float(np.median(row)), 4)}

    # Every retriever on every collection, run as shipped (real retrievers, cached vectors).
    collections: dict[str, dict] = {}
    timings: dict[str, dict] = {}
    for name in names:
        col, v = cols[name], vecs[name]
        qids = judged_ids(col)
        emb = QueryCache(encoder, [col.queries[q] for q in qids], v.queries)
        texts = col.doc_texts
        rows: dict[str, dict] = {}
        tf, s_tf = fitted(TfidfRetriever(), texts)
        rows["tfidf"] = metrics_of(tf, col, s_tf, True)
        bm, s_bm = fitted(BM25Retriever(), texts)
        rows["bm25"] = metrics_of(bm, col, s_bm, True)
        rm, s_rm = fitted(BM25Retriever(rm3=chosen.rm3 or tuning.RM3S[1]), texts)
        rows["bm25+rm3"] = metrics_of(rm, col, s_rm, True)
        embed_s = v.doc_seconds + (v.window_seconds if BEST.window else 0.0)
        dense = dense_for(emb, v, BEST.window)
        rows["dense"] = metrics_of(dense, col, embed_s, True)
        rows["hybrid"] = metrics_of(HybridRetriever([bm, dense]), col, s_bm + embed_s, True)
        runs = [("best", BEST), ("best-loco", BestSettings(**_settings_args(loco[name]["settings"])))]
        for label, s in runs[:1] if args.shipped_only else runs:  # (whole-text vectors only where windows lack)
            t = time.perf_counter()
            r = best_retriever(s, dense=dense_for(emb, v, s.window), min_store=tuning.MIN_STORE)
            r.lexical.fit(texts)
            r.prepare()
            fit_s = time.perf_counter() - t + v.doc_seconds + (v.window_seconds if s.window else 0.0)
            rows[label] = metrics_of(r, col, fit_s, label == "best")
        kept = stored.get("collections", {}).get(name, {})
        kept = kept.get("best-loco", kept.get(LOCO_KEPT))
        if args.shipped_only and kept:
            rows[LOCO_KEPT] = kept
        collections[name] = rows
        t = time.perf_counter()
        knn_graph(v.docs, max(BEST.neighbours, 1))
        timings[name] = {"knn_graph_seconds": round(time.perf_counter() - t, 2)}

    if args.shipped_only:
        report = {**stored, "collections": collections, "timings": timings,
                  "embedding": {"model": encoder.name, "decision": decision, **embed_info},
                  "grid_scored_with": stored.get("grid_scored_with", stored.get("embedding", {}).get("model")),
                  "refreshed": {"command": "python -m bench.retrieval --shipped-only",
                                "date": time.strftime("%Y-%m-%d", time.gmtime()),
                                "what": "collections (every retriever but best-loco), embedding, timings, bars"}}
        report["machine"] = {**stored.get("machine", {}), "load_average_1m": round(os.getloadavg()[0], 2)}
        report["bars"] = bars(report, names)
        (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        print_report(report, names)
        return 0
        # Ablations of the chosen setting: each component switched off, all else equal.
        index = {s: i for i, s in enumerate(settings)}
        from dataclasses import replace
        variants = {"chosen": chosen, "no rm3": replace(chosen, rm3=None), "no rocchio": replace(chosen, rocchio=None),
                    "no windows": replace(chosen, window=0), "windows": replace(chosen, window=126),
                    "no smoothing": replace(chosen, neighbours=0, gain=0.0),
                    "rrf k=60, same smoothing": replace(chosen, fusion="rrf", norm="z", weight=0.5, rrf_k=60)}
        ablation = {label: {n: round(float(means[c, index[s]]), 4) for c, n in enumerate(names)}
                    for label, s in variants.items() if s in index}

    report = {
        "collections": collections,
        "best_settings": {"procedure": tuning.__doc__.split("\n\n")[1].replace("\n", " "),
                          "chosen": settings_json(chosen), "shipped": settings_json(BEST),
                          "shipped_is_chosen": chosen == BEST, "grid_size": len(settings),
                          "mean_rank": round(float(tuning.mean_ranks(means)[pick]), 1),
                          "chosen_ndcg@10": {n: round(float(means[c, pick]), 4) for c, n in enumerate(names)}},
        "leave_one_collection_out": loco,
        "ablation_ndcg@10": ablation,
        "embedding": {"model": encoder.name, **embed_info},
        "indexing": {n: index_cost(n) for n in names},
        "timings": timings,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)},
    }
    report["bars"] = bars(report, names)
    (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print_report(report, names)
    return 0


def shipped_encoder() -> tuple[MiniLMEncoder, str]:
    """The encoder the per-CPU decision picks here, and its line (as `tether ingest` prints it). An
    int8 pick runs from bench.rag_encoder's copy of its graph (the same rewrite, byte for byte), so
    the vectors that bench cached are read back, not embedded again."""
    from bench.rag_encoder.__main__ import graph
    from tether.rag import _encoder_path as _path

    enc = MiniLMEncoder()
    line = _path.describe(enc.path)
    recipe = next((r for r in _path.CANDIDATES if enc.path is not None and r.name == enc.path.recipe), None)
    return (enc if recipe is None else MiniLMEncoder(graph(recipe))), line


def _settings_args(d: dict) -> dict:
    from tether.rag._dense import Rocchio
    from tether.rag._lexical import RM3

    out = dict(d)
    out["rm3"] = RM3(**d["rm3"]) if d["rm3"] else None
    out["rocchio"] = Rocchio(**d["rocchio"]) if d["rocchio"] else None
    return out


def bars(report: dict, names: list[str]) -> dict:
    c = report["collections"]
    out = {}
    if "cisi" in c:
        out["best ndcg@10 >= .47 on cisi"] = c["cisi"]["best"]["ndcg@10"] >= 0.47
    for n in names:
        out[f"best >= hybrid + .02 on {n}"] = c[n]["best"]["ndcg@10"] >= c[n]["hybrid"]["ndcg@10"] + 0.02
    out["best's settings are the procedure's choice"] = report["best_settings"]["shipped_is_chosen"]
    out["lexical > 2,000 queries/s"] = all(c[n][r]["queries_per_second"] > 2000 for n in names for r in ("tfidf", "bm25"))
    out["lexical > 2,000 queries per CPU second"] = all(c[n][r]["queries_per_cpu_second"] > 2000 for n in names
                                                        for r in ("tfidf", "bm25"))
    return out


def print_report(report: dict, names: list[str]) -> None:
    c = report["collections"]
    retrievers = list(next(iter(c.values())))
    print(f"{'retriever':<12}" + "".join(f"{n + ' ' + m:>20}" for n in names for m in METRICS))
    for r in retrievers:
        print(f"{r:<12}" + "".join(f"{c[n][r][m]:>20.4f}" for n in names for m in METRICS))
    print("\nindex seconds / queries per second (wall clock) / queries per CPU second")
    for r in retrievers:
        print(f"{r:<12}" + "".join(f"{c[n][r]['index_seconds']:>10.2f} / {c[n][r].get('queries_per_second', float('nan')):>7.1f}"
                                   f" / {c[n][r].get('queries_per_cpu_second', float('nan')):>7.1f}" for n in names))
    b = report["best_settings"]
    print(f"\nchosen across collections (mean rank {b['mean_rank']} of {b['grid_size']}): {b['chosen']}")
    for n, lo in report["leave_one_collection_out"].items():
        print(f"leave {n} out: nDCG@10 {lo['ndcg@10']:.4f} (rank {lo['grid_rank']} of {lo['grid_size']} there; "
              f"grid max {lo['grid_max']:.4f}, median {lo['grid_median']:.4f}) with {lo['settings']}")
    print("\nablation (nDCG@10, grid scoring):")
    for label, row in report["ablation_ndcg@10"].items():
        print(f"  {label:<26}" + "".join(f"{n} {v:.4f}  " for n, v in row.items()))
    print(f"\npeak RSS of this bench {report['machine']['peak_rss_mb']} MB; embedding {report['embedding']}")
    for n, row in report["indexing"].items():
        print(f"index {n}: {row}")
    for bar, ok in report["bars"].items():
        print(f"bar {bar}: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    raise SystemExit(main())
