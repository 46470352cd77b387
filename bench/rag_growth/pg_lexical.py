"""Does PostgreSQL's BM25 rank as the SQLite index ranks? `python -m bench.rag_growth.pg_lexical [--collection cisi]`.

A development collection from /work/shared/data (each document one source, as `tether
eval-retrieval --index` keeps it) goes into a SQLite index and a PostgreSQL index, with `bm25` (no
feedback) and with `best` (BM25 with RM3 on the server, fused with a dense side that is the same
client-side code on both; the cheap hashed embedder of bench.rag_growth.dense, so no encoder runs).
For every judged query: overlap@10 of the two top 10s (passages), nDCG@10 of PostgreSQL's ranking taking the
SQLite ranking as the ideal (graded by rank: 10 for its first, 1 for its tenth), the largest score
difference over the top 20, and each backend's nDCG@10 against the collection's judgments.
Figures go under `pg_lexical` in results.json. PostgreSQL: $TETHER_BENCH_POSTGRES (a database
`tether_bench_pg_lexical` is created and dropped).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.rag_growth.__main__ import HERE
from bench.rag_growth.dense import PG, HashedBag

DB = "tether_bench_pg_lexical"


def _ndcg(ranked: list[str], ideal: list[str], k: int = 10) -> float:
    gain = {d: k - i for i, d in enumerate(ideal[:k])}
    dcg = sum(gain.get(d, 0) / np.log2(i + 2) for i, d in enumerate(ranked[:k]))
    idcg = sum(g / np.log2(i + 2) for i, g in enumerate(sorted(gain.values(), reverse=True)))
    return float(dcg / idcg) if idcg else 1.0


def main() -> None:
    import psycopg

    from tether.rag._evaluate import load_collection
    from tether.rag._index import Index
    from tether.rag._metrics import ndcg_at_k

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collection", default="cisi")
    args = ap.parse_args()
    d = Path("/work/shared/data") / args.collection
    col = load_collection(d / "corpus.jsonl", d / "queries.jsonl", d / "qrels.tsv")
    qids = [q for q in col.queries if q in col.qrels]
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    out: dict[str, dict] = {}
    try:
        for retriever in ("bm25", "best"):
            with tempfile.TemporaryDirectory() as tmp, \
                    Index(Path(tmp) / "ix", retriever=retriever, embedder=HashedBag()) as lite, \
                    Index.open(f"{PG.rpartition('/')[0]}/{DB}#{retriever}", retriever=retriever,
                               embedder=HashedBag()) as pg:
                for idx in (lite, pg):
                    idx.add_texts(zip(col.doc_ids, col.doc_texts, strict=True), markdown=False)
                overlap, agree, diff, own = [], [], [], {"sqlite": [], "postgres": []}
                took = {"sqlite": 0.0, "postgres": 0.0}
                for q in qids:
                    ranked = {}
                    for name, idx in (("sqlite", lite), ("postgres", pg)):
                        w = time.perf_counter()
                        hits = idx.search(col.queries[q], 20)
                        took[name] += time.perf_counter() - w
                        ranked[name] = hits
                        own[name].append(ndcg_at_k([h.source for h in hits], col.qrels[q]))
                    a = [h.id for h in ranked["sqlite"]]
                    b = [h.id for h in ranked["postgres"]]
                    overlap.append(len(set(a[:10]) & set(b[:10])) / max(min(len(a), 10), 1))
                    agree.append(_ndcg(b, a))
                    score_a = {h.id: h.score for h in ranked["sqlite"]}
                    diff += [abs(h.score - score_a[h.id]) for h in ranked["postgres"] if h.id in score_a]
                out[retriever] = {
                    "queries": len(qids), "overlap_at_10": round(float(np.mean(overlap)), 4),
                    "min_overlap_at_10": round(float(np.min(overlap)), 4),
                    "ndcg_at_10_vs_sqlite": round(float(np.mean(agree)), 4),
                    "max_score_difference": float(f"{max(diff):.3g}"),
                    "ndcg_at_10_sqlite": round(float(np.mean(own["sqlite"])), 4),
                    "ndcg_at_10_postgres": round(float(np.mean(own["postgres"])), 4),
                    "ms_per_query_sqlite": round(1000 * took["sqlite"] / len(qids), 1),
                    "ms_per_query_postgres": round(1000 * took["postgres"] / len(qids), 1)}
                print(retriever, json.dumps(out[retriever]), flush=True)
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    path = HERE / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results["pg_lexical"] = {"collection": args.collection, "embedder": HashedBag.name, "rows": out,
                             "command": f"python -m bench.rag_growth.pg_lexical --collection {args.collection}"}
    path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
