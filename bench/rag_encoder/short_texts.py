"""Where the int8 graphs lose precision, by text length: `python -m bench.rag_encoder.short_texts`.

Each int8 recipe the per-CPU decision can pick (tether.rag._encoder_path.CANDIDATES) against the
shipped float graph, cosine of their vectors of the same texts, grouped by length in tokens ([CLS]
and [SEP] included): one-word and short queries, 400 random word runs of 1-32 words from the first
300 CISI abstracts, and 100 whole abstracts. Both graphs run as given (no short-text routing), so
this is what tether.rag._encoder.SHORT_TOKENS is chosen from.

`--quality cacm,cisi,med`: nDCG@10 of `best` (shipped settings) per int8 recipe with the vectors
of queries and documents of at most SHORT_TOKENS tokens taken from the float graph instead, as
tether now embeds them; scoring only, from the vectors `python -m bench.rag_encoder` cached
(fails if they are not). Writes `short_texts` into bench/rag_encoder/results.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np

from bench.retrieval.__main__ import data_dir
from tether.rag import _encoder_path as _path
from tether.rag._encoder import SHORT_TOKENS, MiniLMEncoder, find_model_file

HERE = Path(__file__).resolve().parent
NAMED = ["x", "ok", "yes", "no", "a", "hi", "refund", "money back", "help", "Python", "what is bm25",
         "how do I get a refund", "Can I get my money back?", "Refunds are issued within 30 days of the return."]
GROUPS = ((1, 3), (4, 4), (5, 5), (6, 6), (7, 8), (9, 16), (17, 26), (27, 300))


def quality(name: str) -> dict:
    """`best`'s nDCG@10 per recipe, with and without short texts' vectors from the float graph."""
    from bench.rag_encoder.__main__ import graph, per_query
    from bench.retrieval.__main__ import QueryCache, dense_for
    from bench.retrieval.embed_cache import collection_vectors, judged_ids
    from tether.rag._dense import DenseRetriever
    from tether.rag._evaluate import load_collection
    from tether.rag._settings import BEST, best_retriever

    root = data_dir()
    col = load_collection(root / name / "corpus.jsonl", root / name / "queries.jsonl", root / name / "qrels.tsv")
    texts = [col.queries[q] for q in judged_ids(col)]
    encs = {k: MiniLMEncoder(graph(r), threads=1) for k, r in [("float", None), *((r.name, r) for r in _path.CANDIDATES)]}
    vs = {k: collection_vectors(name, col, DenseRetriever(e, window=126, stride=63), pooled_only=True)
          for k, e in encs.items()}
    if not all(v.from_cache for v in vs.values()):
        raise SystemExit(f"{name}: vectors were not cached; run python -m bench.rag_encoder first")
    tok = encs["float"]._tok
    short_q = np.array([len(e.ids) <= SHORT_TOKENS for e in tok.encode_batch(texts)])
    short_d = np.array([len(e.ids) <= SHORT_TOKENS for e in tok.encode_batch(list(col.doc_texts))])
    row: dict = {"judged_queries": len(texts), "short_queries": int(short_q.sum()),
                 "short_held_out_queries": int(short_q[1::2].sum()), "documents": len(short_d),
                 "short_documents": int(short_d.sum())}
    for k in (r.name for r in _path.CANDIDATES):
        mixed = dataclasses.replace(vs[k], docs=np.where(short_d[:, None], vs["float"].docs, vs[k].docs),
                                    queries=np.where(short_q[:, None], vs["float"].queries, vs[k].queries))
        for label, v in ((k, vs[k]), (f"{k}, short texts in float", mixed)):
            best = best_retriever(BEST, dense=dense_for(QueryCache(encs[k], texts, v.queries), v, BEST.window))
            best.lexical.fit(col.doc_texts)
            best.prepare()
            s = per_query(best, col)
            row[label] = {"held_out": round(float(s[1::2].mean()), 4), "all": round(float(s.mean()), 4)}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quality", default="", help="development collections to score (needs the bench cache)")
    args = ap.parse_args(argv)
    abstracts = [json.loads(line)["text"] for line in
                 (data_dir() / "cisi" / "corpus.jsonl").read_text().splitlines()[:300]]
    words = " ".join(abstracts).split()
    rng = np.random.default_rng(0)
    texts = list(NAMED)
    for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
        for _ in range(40):
            s = int(rng.integers(0, len(words) - n))
            texts.append(" ".join(words[s : s + n]))
    texts += abstracts[:100]
    source = find_model_file()
    slow = MiniLMEncoder(source, threads=1)
    ref = slow.embed(texts)
    ntok = np.array([len(e.ids) for e in slow._tok.encode_batch(texts)])
    report: dict = {"command": "python -m bench.rag_encoder.short_texts" + (f" --quality {args.quality}" if args.quality else ""), "texts": len(texts), "recipes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in _path.CANDIDATES:
            graph = Path(tmp) / f"{recipe.name}.onnx"
            recipe.rewrite(source, graph)
            cos = (MiniLMEncoder(graph, threads=1).embed(texts) * ref).sum(axis=1)
            row: dict = {"named": {t: round(float(c), 4) for t, c in zip(NAMED, cos, strict=False)}, "by_tokens": {}}
            for lo, hi in GROUPS:
                sel = (ntok >= lo) & (ntok <= hi)
                row["by_tokens"][f"{lo}-{hi}"] = {"texts": int(sel.sum()), "min": round(float(cos[sel].min()), 4),
                                                  "mean": round(float(cos[sel].mean()), 4),
                                                  "below_0.99": int((cos[sel] < 0.99).sum())}
            report["recipes"][recipe.name] = row
    if args.quality:
        report["quality_best_ndcg10"] = {n: quality(n) for n in args.quality.split(",") if n}
    path = HERE / "results.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored["short_texts"] = report
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
