"""Combining retrievers: reciprocal rank fusion, and `best` (normalised-score fusion with
neighbour smoothing, weighted per query by how far each side's top passage stands out).

The score functions work on the last axis, so the same code ranks one query (a vector) in a
retriever and every query of a collection at once (a matrix) in bench/retrieval's tuning.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tether._errors import InvalidInput
from tether.rag._base import Retriever, top_k
from tether.rag._dense import DenseRetriever, knn_graph

NORMS = ("z", "minmax")
FUSIONS = ("sum", "rrf")


def zscore(s: np.ndarray) -> np.ndarray:
    return normalise(s, "z")


def normalise(s: np.ndarray, how: str = "z") -> np.ndarray:
    """z-scores (`z`) or min-max to [0, 1] (`minmax`) along the last axis; a constant row gives 0."""
    s = np.asarray(s, dtype=np.float32)
    if how == "z":
        sd = s.std(axis=-1, keepdims=True)
        return (s - s.mean(axis=-1, keepdims=True)) / np.where(sd > 0, sd, 1.0)
    if how == "minmax":
        lo, hi = s.min(axis=-1, keepdims=True), s.max(axis=-1, keepdims=True)
        return (s - lo) / np.where(hi > lo, hi - lo, 1.0)
    raise InvalidInput(f"unknown normalisation {how!r}; use one of: {', '.join(NORMS)}")


def smooth(x: np.ndarray, graph: np.ndarray | None, gain: float, how: str = "z") -> np.ndarray:
    """Normalise, add `gain` times the mean over each passage's neighbours (`graph` rows), and
    normalise again (the cluster hypothesis: a passage among matching passages is likely relevant)."""
    z = normalise(x, how)
    if graph is None or graph.shape[1] == 0 or gain == 0:
        return z
    return normalise(z + gain * z[..., graph].mean(axis=-1), how)


def rrf_scores(score_lists: Sequence[np.ndarray], k: int = 60, depth: int = 1000) -> np.ndarray:
    """Reciprocal rank fusion along the last axis: sum over lists of 1 / (k + rank), rank counted
    from 1 (ties by position), only the top `depth` of each list counting."""
    out = np.zeros(np.shape(score_lists[0]) if score_lists else (0,), dtype=np.float64)
    for s in score_lists:
        order = np.argsort(-np.asarray(s), axis=-1, kind="stable")
        ranks = np.empty_like(order)
        np.put_along_axis(ranks, order, np.arange(1, order.shape[-1] + 1), axis=-1)
        out += np.where(ranks <= depth, 1.0 / (k + ranks), 0.0)
    return out.astype(np.float32)


def fuse(lexical: np.ndarray, dense: np.ndarray, *, how: str = "sum", weight: float = 0.5,
         rrf_k: int = 60) -> np.ndarray:
    """`weight * lexical + (1 - weight) * dense` (inputs already normalised), or their RRF."""
    if how == "sum":
        return (weight * lexical + (1.0 - weight) * dense).astype(np.float32)
    if how == "rrf":
        return rrf_scores([lexical, dense], rrf_k)
    raise InvalidInput(f"unknown fusion {how!r}; use one of: {', '.join(FUSIONS)}")


def peak_weight(lexical: np.ndarray, dense: np.ndarray, weight: float, power: float) -> np.ndarray:
    """The lexical share of a weighted sum, per query: `weight` tilted towards the side whose top
    passage stands out more (its largest normalised score, `p`): w * pl^power / (w * pl^power +
    (1 - w) * pd^power). A side with no signal (a constant row, e.g. no query term in any passage)
    gets next to no share; `power=0` keeps `weight`. Shape: one value per row (keepdims)."""
    pl = np.maximum(lexical.max(axis=-1, keepdims=True), 1e-3).astype(np.float64) ** power
    pd = np.maximum(dense.max(axis=-1, keepdims=True), 1e-3).astype(np.float64) ** power
    return (weight * pl / (weight * pl + (1.0 - weight) * pd)).astype(np.float32)


class HybridRetriever:
    """Reciprocal rank fusion (k=60) of several retrievers (by default BM25 and dense)."""

    name = "hybrid"

    def __init__(self, parts: Sequence[Retriever], k: int = 60, depth: int = 1000) -> None:
        self.parts = list(parts)
        self.k, self.depth = k, depth

    def fit(self, texts: Sequence[str]) -> None:
        for p in self.parts:
            p.fit(texts)

    def scores(self, query: str) -> np.ndarray:
        return rrf_scores([p.scores(query) for p in self.parts], self.k, self.depth)

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        return top_k(self.scores(query), k)


class FusionRetriever:
    """Fusion of a lexical and a dense retriever after neighbour smoothing.

    Each side: s'(d) = norm(norm(s)(d) + gain * mean(norm(s)(n) for n in the `neighbours` nearest
    passages of d)); then `weight * lex' + (1 - weight) * dense'` (`fusion="sum"`) or their RRF.
    `neighbours=0` (or a store under `min_store` passages) skips the smoothing. With `peak` > 0 (a
    weighted sum), the weight is set per query by `peak_weight`: a query whose best lexical match
    stands out leans lexical, one whose words match nothing in particular leans dense.
    """

    name = "best"

    def __init__(
        self,
        lexical: Retriever,
        dense: DenseRetriever,
        *,
        weight: float = 0.5,
        neighbours: int = 10,
        gain: float = 1.0,
        norm: str = "z",
        fusion: str = "sum",
        rrf_k: int = 60,
        min_store: int = 100,
        peak: float = 0.0,
    ) -> None:
        if norm not in NORMS or fusion not in FUSIONS:
            raise InvalidInput(f"norm must be one of {NORMS} and fusion one of {FUSIONS}")
        self.lexical, self.dense = lexical, dense
        self.weight, self.neighbours, self.gain = weight, neighbours, gain
        self.norm, self.fusion, self.rrf_k = norm, fusion, rrf_k
        self.min_store, self.peak = min_store, peak
        self.graph: np.ndarray | None = None

    def fit(self, texts: Sequence[str]) -> None:
        self.lexical.fit(texts)
        self.dense.fit(texts)
        self.prepare()

    def prepare(self, graph: np.ndarray | None = None) -> None:
        """Build (or take) the neighbour graph once both parts are fitted."""
        # In a small store every passage neighbours every other and smoothing only blurs.
        if self.neighbours <= 0 or self.gain == 0 or self.dense.size < self.min_store:
            self.graph = None
            return
        if graph is None or graph.shape[1] < self.neighbours:
            graph = knn_graph(np.asarray(self.dense.vectors), self.neighbours, ivf=self.dense.ivf)
        self.graph = graph[:, : self.neighbours]

    def combine(self, lexical: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """Fused scores from raw lexical and dense scores (one query, or a matrix of queries)."""
        lex = smooth(lexical, self.graph, self.gain, self.norm)
        den = smooth(dense, self.graph, self.gain, self.norm)
        if self.fusion == "sum" and self.peak and lex.shape[-1]:
            w = peak_weight(lex, den, self.weight, self.peak)
            return (w * lex + (1.0 - w) * den).astype(np.float32)
        return fuse(lex, den, how=self.fusion, weight=self.weight, rrf_k=self.rrf_k)

    def scores(self, query: str) -> np.ndarray:
        return self.combine(self.lexical.scores(query), self.dense.scores(query))

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        return top_k(self.scores(query), k)
