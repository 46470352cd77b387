"""Ranking metrics (trec_eval definitions): nDCG@k with linear gains, Recall@k, average precision."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tether._errors import InvalidInput


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """DCG of the top k (gain = relevance, discount log2(rank + 1)) over the ideal DCG."""
    dcg = sum(qrels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted((r for r in qrels.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    relevant = {d for d, r in qrels.items() if r > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def average_precision(ranked: Sequence[str], qrels: Mapping[str, int]) -> float:
    """Mean of precision at each relevant document's rank, over all relevant documents."""
    relevant = {d for d, r in qrels.items() if r > 0}
    if not relevant:
        return 0.0
    hits, total = 0, 0.0
    for i, d in enumerate(ranked):
        if d in relevant:
            hits += 1
            total += hits / (i + 1)
    return total / len(relevant)


def summarize(runs: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """Mean nDCG@10, Recall@10, Recall@100 and MAP over the judged queries in `runs`."""
    judged = [q for q in runs if any(r > 0 for r in qrels.get(q, {}).values())]
    if not judged:
        raise InvalidInput("no query in the run has a relevance judgment")
    n = len(judged)
    return {
        "ndcg@10": sum(ndcg_at_k(runs[q], qrels[q], 10) for q in judged) / n,
        "recall@10": sum(recall_at_k(runs[q], qrels[q], 10) for q in judged) / n,
        "recall@100": sum(recall_at_k(runs[q], qrels[q], 100) for q in judged) / n,
        "map": sum(average_precision(runs[q], qrels[q]) for q in judged) / n,
    }
