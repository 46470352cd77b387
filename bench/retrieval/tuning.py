"""Choosing `best`'s settings across collections: one grid, scored per query on every collection.

Procedure (the only one used for any setting): every grid point is scored by mean nDCG@10 on each
collection; points are ranked within each collection (1 = best); the point with the lowest mean
rank over the collections wins (ties: higher mean nDCG@10). Leave-one-collection-out: the same
choice made on all collections but one, scored on that one.

Scoring is vectorised: for each collection the raw score matrices (judged queries x documents) of
every lexical and dense variant are computed once with the real retrievers, then smoothed,
normalised and fused with the same functions `FusionRetriever` uses.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from tether.rag._dense import DenseRetriever, Rocchio, knn_graph
from tether.rag._evaluate import Collection
from tether.rag._fusion import rrf_scores, smooth
from tether.rag._lexical import RM3, BM25Retriever
from tether.rag._settings import BestSettings

K1B = ((0.9, 0.4), (1.2, 0.4), (1.2, 0.75), (1.5, 0.75))
RM3S: tuple[RM3 | None, ...] = (None, RM3(docs=10, terms=20, original=0.5), RM3(docs=10, terms=20, original=0.7))
WINDOWS = (0, 126)
ROCCHIOS: tuple[Rocchio | None, ...] = (None, Rocchio(docs=10, beta=0.5), Rocchio(docs=5, beta=1.0))
NORMS = ("z", "minmax")
WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7)
RRF_KS = (10, 60)
SMOOTHING = ((0, 0.0), *tuple(itertools.product((5, 10, 20), (0.5, 1.0, 2.0))))
MIN_STORE = 100


def grid() -> list[BestSettings]:
    out = []
    for (k1, b), rm3, window, rocchio in itertools.product(K1B, RM3S, WINDOWS, ROCCHIOS):
        base = BestSettings(k1=k1, b=b, rm3=rm3, window=window, rocchio=rocchio)
        for n, g in SMOOTHING:
            for norm, w in itertools.product(NORMS, WEIGHTS):
                out.append(replace(base, norm=norm, fusion="sum", weight=w, neighbours=n, gain=g, rrf_k=60))
            for k in RRF_KS:
                out.append(replace(base, norm="z", fusion="rrf", weight=0.5, neighbours=n, gain=g, rrf_k=k))
    return out


@dataclass
class Judged:
    """One collection's judged queries as arrays: relevance gains (queries x docs) and ideal DCG@10."""

    gains: np.ndarray
    idcg: np.ndarray

    @classmethod
    def of(cls, col: Collection, qids: list[str]) -> Judged:
        pos = {d: i for i, d in enumerate(col.doc_ids)}
        gains = np.zeros((len(qids), len(col.doc_ids)), dtype=np.float32)
        idcg = np.zeros(len(qids))
        disc = 1.0 / np.log2(np.arange(2, 12))
        for r, q in enumerate(qids):
            rels = sorted((v for v in col.qrels[q].values() if v > 0), reverse=True)[:10]
            idcg[r] = float(np.dot(rels, disc[: len(rels)]))
            for d, v in col.qrels[q].items():
                if d in pos:
                    gains[r, pos[d]] = v
        return cls(gains, idcg)

    def ndcg10(self, scores: np.ndarray) -> np.ndarray:
        """Per-query nDCG@10 of a score matrix (ties broken by document position, as `top_k`)."""
        part = np.sort(np.argpartition(-scores, 9, axis=1)[:, :10], axis=1)
        top = np.take_along_axis(scores, part, axis=1)
        order = np.take_along_axis(part, np.argsort(-top, axis=1, kind="stable"), axis=1)
        dcg = (np.take_along_axis(self.gains, order, axis=1) / np.log2(np.arange(2, 12))).sum(axis=1)
        return np.where(self.idcg > 0, dcg / np.where(self.idcg > 0, self.idcg, 1), 0.0)


def lexical_matrix(col: Collection, queries: list[str], k1: float, b: float, rm3: RM3 | None) -> np.ndarray:
    r = BM25Retriever(k1, b, rm3=rm3)
    r.fit(col.doc_texts)
    return np.stack([r.scores(q) for q in queries])


def dense_matrix(dense: DenseRetriever, qvecs: np.ndarray, rocchio: Rocchio | None) -> np.ndarray:
    dense.rocchio = rocchio
    out = np.stack([dense.scores_for(dense.feedback_vector(q)) for q in qvecs])
    dense.rocchio = None
    return out


def score_grid(col: Collection, qids: list[str], dense_by_window: dict[int, DenseRetriever], qvecs: np.ndarray,
               settings: list[BestSettings], log=lambda s: None) -> np.ndarray:
    """Per-query nDCG@10 for every setting: array (settings, queries)."""
    judged = Judged.of(col, qids)
    queries = [col.queries[q] for q in qids]
    vectors = np.asarray(dense_by_window[0].vectors)
    graph_all = knn_graph(vectors, max(n for n, _ in SMOOTHING)) if len(vectors) >= MIN_STORE else None
    smoothed: dict[tuple, np.ndarray] = {}

    def side(key: tuple, raw, n: int, g: float, norm: str, rank_k: int | None) -> np.ndarray:
        full = (key, n, g, norm, rank_k)
        if full not in smoothed:
            base_key = (key, n, g, norm, None)
            if base_key not in smoothed:
                graph = graph_all[:, :n] if (n and graph_all is not None) else None
                smoothed[base_key] = smooth(raw(), graph, g, norm)
            if rank_k is not None:
                smoothed[full] = rrf_scores([smoothed[base_key]], rank_k)
        return smoothed[full]

    raw_cache: dict[tuple, np.ndarray] = {}

    def raw_lex(k1, b, rm3):
        key = ("L", k1, b, rm3)
        if key not in raw_cache:
            log(f"    bm25 k1={k1} b={b} rm3={rm3}")
            raw_cache[key] = lexical_matrix(col, queries, k1, b, rm3)
        return raw_cache[key]

    def raw_den(window, rocchio):
        key = ("D", window, rocchio)
        if key not in raw_cache:
            raw_cache[key] = dense_matrix(dense_by_window[window], qvecs, rocchio)
        return raw_cache[key]

    out = np.zeros((len(settings), len(qids)), dtype=np.float32)
    for i, s in enumerate(settings):
        lk, dk = ("L", s.k1, s.b, s.rm3), ("D", s.window, s.rocchio)
        rk = s.rrf_k if s.fusion == "rrf" else None
        norm = "z" if s.fusion == "rrf" else s.norm
        lex = side(lk, lambda s=s: raw_lex(s.k1, s.b, s.rm3), s.neighbours, s.gain, norm, rk)
        den = side(dk, lambda s=s: raw_den(s.window, s.rocchio), s.neighbours, s.gain, norm, rk)
        fused = lex + den if rk is not None else s.weight * lex + (1 - s.weight) * den
        out[i] = judged.ndcg10(fused)
    return out


def mean_ranks(means: np.ndarray) -> np.ndarray:
    """Rank of each setting within each collection (1 = best, ties share the mean rank), averaged.
    `means` is (collections, settings)."""
    ranks = np.zeros_like(means, dtype=np.float64)
    for c, row in enumerate(means):
        order = np.argsort(-row, kind="stable")
        r = np.empty(len(row))
        r[order] = np.arange(1, len(row) + 1)
        for v in np.unique(row):  # ties share their mean rank
            tie = row == v
            r[tie] = r[tie].mean()
        ranks[c] = r
    return ranks.mean(axis=0)


def choose(means: np.ndarray) -> int:
    """The setting with the lowest mean rank over the collections (ties: higher mean nDCG@10)."""
    mr = mean_ranks(means)
    return int(np.lexsort((-means.mean(axis=0), mr))[0])
