"""Combining retrievers: reciprocal rank fusion, and the measured best configuration.

`best` on CISI (see docs/retrieval.md): each of BM25 and dense scores is z-normalised over the
store, smoothed over each passage's 10 nearest neighbours in embedding space (a passage whose
neighbours match the query gains; the cluster hypothesis), z-normalised again and averaged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tether.rag.base import Retriever, top_k
from tether.rag.dense import DenseRetriever, knn_graph


def zscore(s: np.ndarray) -> np.ndarray:
    sd = float(s.std())
    return (s - float(s.mean())) / (sd if sd > 0 else 1.0)


def rrf_scores(score_lists: Sequence[np.ndarray], k: int = 60, depth: int = 1000) -> np.ndarray:
    """Reciprocal rank fusion: sum over lists of 1 / (k + rank), rank counted from 1, top `depth` each."""
    n = len(score_lists[0]) if score_lists else 0
    out = np.zeros(n, dtype=np.float64)
    for s in score_lists:
        for rank, (pos, _) in enumerate(top_k(s, depth), start=1):
            out[pos] += 1.0 / (k + rank)
    return out.astype(np.float32)


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


class SmoothedFusionRetriever:
    """z-score fusion of a lexical and a dense retriever after neighbour smoothing.

    s'(d) = z(s)(d) + gain * mean(z(s)(n) for n in the `neighbours` nearest passages of d);
    final = weight * z(s'_lexical) + (1 - weight) * z(s'_dense).
    `neighbours=0` gives plain weighted z-score fusion, as does a store under `min_store` passages.
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
        min_store: int = 100,
    ) -> None:
        self.lexical, self.dense = lexical, dense
        self.weight, self.neighbours, self.gain = weight, neighbours, gain
        self.min_store = min_store
        self.graph: np.ndarray | None = None

    def fit(self, texts: Sequence[str]) -> None:
        self.lexical.fit(texts)
        self.dense.fit(texts)
        self.prepare()

    def prepare(self, graph: np.ndarray | None = None) -> None:
        """Build (or take) the neighbour graph once both parts are fitted."""
        # In a small store every passage neighbours every other and smoothing only blurs.
        if self.neighbours <= 0 or len(self.dense.vectors) < self.min_store:
            self.graph = None
            return
        if graph is None or graph.shape[1] < self.neighbours:
            graph = knn_graph(np.asarray(self.dense.vectors), self.neighbours, ivf=self.dense.ivf)
        self.graph = graph[:, : self.neighbours]

    def _smooth(self, s: np.ndarray) -> np.ndarray:
        z = zscore(s)
        if self.graph is None or self.graph.shape[1] == 0:
            return z
        return zscore(z + self.gain * z[self.graph].mean(axis=1))

    def scores(self, query: str) -> np.ndarray:
        lex = self._smooth(self.lexical.scores(query))
        den = self._smooth(self.dense.scores(query))
        return (self.weight * lex + (1.0 - self.weight) * den).astype(np.float32)

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        return top_k(self.scores(query), k)
