"""The one interface every retriever implements, and what a search returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(slots=True)
class Hit:
    """One retrieved passage. `position` indexes the texts the retriever was fitted on."""

    position: int
    score: float
    id: str = ""
    source: str = ""
    heading: str = ""
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Retriever(Protocol):
    """Scores passages for a query.

    `fit` takes the passage texts (positions 0..n-1); `scores` returns one score per passage
    (higher is better); `search` returns the top `k` as (position, score), best first.
    """

    name: str

    def fit(self, texts: Sequence[str]) -> None: ...

    def scores(self, query: str) -> np.ndarray: ...

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]: ...


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k best (position, score) pairs, best first; ties broken by position for stable output."""
    n = scores.shape[0]
    if n == 0 or k <= 0:
        return []
    k = min(k, n)
    part = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
    if k < n:  # argpartition picks any of the passages tied at the cut: take the first ones
        kth = scores[part].min()
        above = np.flatnonzero(scores > kth)
        part = np.concatenate([above, np.flatnonzero(scores == kth)[: k - len(above)]])
    order = part[np.lexsort((part, -scores[part]))]
    return [(int(i), float(scores[i])) for i in order]
