"""Dense retrieval: cosine over sentence embeddings, brute force or IVF when the store is large."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tether.rag.ann import IVFIndex
from tether.rag.base import top_k
from tether.rag.encoder import Embedder, MiniLMEncoder

# Above this many vectors, search probes an IVF partition instead of scanning every vector.
ANN_THRESHOLD = 50_000


class DenseRetriever:
    """Embeds passages once (`fit`) or takes stored vectors (`set_vectors`) and scores by cosine."""

    name = "dense"

    def __init__(self, embedder: Embedder | None = None, *, ann_threshold: int = ANN_THRESHOLD) -> None:
        self._embedder = embedder
        self.ann_threshold = ann_threshold
        self.vectors = np.zeros((0, embedder.dim if embedder else 384), dtype=np.float32)
        self.ivf: IVFIndex | None = None

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = MiniLMEncoder()
        return self._embedder

    def fit(self, texts: Sequence[str]) -> None:
        self.set_vectors(self.embedder.embed(list(texts)))

    def set_vectors(self, vectors: np.ndarray, ivf: IVFIndex | None = None) -> None:
        """Use precomputed (L2-normalised) vectors; builds an IVF index above the threshold."""
        self.vectors = vectors
        if ivf is None and len(vectors) > self.ann_threshold:
            ivf = IVFIndex.build(np.asarray(vectors))
        self.ivf = ivf

    def query_vector(self, query: str) -> np.ndarray:
        return self.embedder.embed([query])[0]

    def scores_for(self, qv: np.ndarray) -> np.ndarray:
        if self.ivf is None:
            return np.asarray(self.vectors @ qv, dtype=np.float32)
        rows = self.ivf.candidates(qv)
        part = np.asarray(self.vectors[rows] @ qv, dtype=np.float32)
        out = np.full(len(self.vectors), part.min() if len(part) else 0.0, dtype=np.float32)
        out[rows] = part
        return out

    def scores(self, query: str) -> np.ndarray:
        return self.scores_for(self.query_vector(query))

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        qv = self.query_vector(query)
        if self.ivf is None:
            return top_k(self.scores_for(qv), k)
        rows = self.ivf.candidates(qv)
        part = np.asarray(self.vectors[rows] @ qv, dtype=np.float32)
        return [(int(rows[i]), s) for i, s in top_k(part, k)]


def knn_graph(vectors: np.ndarray, k: int = 10, *, block: int = 2048, ivf: IVFIndex | None = None) -> np.ndarray:
    """Each vector's `k` nearest other vectors by cosine, as an (n, k) array of row numbers."""
    n = len(vectors)
    k = min(k, max(n - 1, 0))
    out = np.zeros((n, k), dtype=np.int32)
    if k == 0:
        return out
    if ivf is not None:
        for i in range(n):
            rows = ivf.candidates(vectors[i])
            rows = rows[rows != i]
            sims = vectors[rows] @ vectors[i]
            best = rows[np.argsort(-sims)[:k]]
            out[i, : len(best)] = best
            out[i, len(best) :] = i  # too few candidates: point at itself
        return out
    for start in range(0, n, block):
        sims = np.asarray(vectors[start : start + block] @ vectors.T)
        rows = np.arange(start, min(start + block, n))
        sims[rows - start, rows] = -np.inf
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1)
        out[start : start + len(rows)] = np.take_along_axis(part, order, axis=1)
    return out
