"""Evaluate a retriever on a collection in BEIR's layout (corpus.jsonl, queries.jsonl, qrels)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tether._errors import InvalidInput
from tether.rag._base import Retriever
from tether.rag._metrics import summarize

if TYPE_CHECKING:
    from tether.rag._index import Index

RETRIEVERS = ("tfidf", "bm25", "dense", "hybrid", "best")


@dataclass
class Collection:
    doc_ids: list[str]
    doc_texts: list[str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise InvalidInput(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


def load_collection(corpus: str | Path, queries: str | Path, qrels: str | Path) -> Collection:
    """Read BEIR files: corpus rows {id|_id, title, text}, query rows {id|_id, text}, and qrels as
    TSV `query-id doc-id relevance` (a header line is skipped) or TREC's `qid iter doc-id relevance`."""
    docs = _jsonl(Path(corpus))
    ids, texts = [], []
    for row in docs:
        did = row.get("id", row.get("_id"))
        if did is None:
            raise InvalidInput(f"{corpus}: a document has no id")
        ids.append(str(did))
        texts.append(" ".join(p for p in (row.get("title") or "", row.get("text") or "") if p))
    qs = {str(r.get("id", r.get("_id"))): r.get("text", "") for r in _jsonl(Path(queries))}
    judged: dict[str, dict[str, int]] = {}
    for n, line in enumerate(Path(qrels).read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 3:
            raise InvalidInput(f"{qrels}:{n}: expected query-id, doc-id, relevance")
        try:
            rel = int(float(parts[-1]))
        except ValueError:
            if n == 1:
                continue  # header
            raise InvalidInput(f"{qrels}:{n}: relevance {parts[-1]!r} is not a number") from None
        # TREC qrels put an unused iteration column between the two ids: `qid 0 docid rel`
        judged.setdefault(parts[0], {})[parts[2] if len(parts) >= 4 else parts[1]] = rel
    return Collection(ids, texts, qs, judged)


def unjudged_ids(col: Collection) -> tuple[set[str], set[str]]:
    """The document ids the qrels name that are not in the corpus, and the query ids they name
    that are not among the queries (they can never be found: a typo or the wrong file)."""
    docs = set(col.doc_ids)
    return ({d for judged in col.qrels.values() for d in judged if d not in docs},
            {q for q in col.qrels if q not in col.queries})


def make_retriever(name: str) -> Retriever:
    """A fresh retriever by name: tfidf, bm25, dense, hybrid (RRF of bm25 + dense) or best."""
    from tether.rag._dense import DenseRetriever
    from tether.rag._fusion import HybridRetriever
    from tether.rag._lexical import BM25Retriever, TfidfRetriever
    from tether.rag._settings import BEST, best_retriever

    def dense() -> DenseRetriever:
        return DenseRetriever(window=BEST.window, stride=max(BEST.window // 2, 1))

    makers: dict[str, Callable[[], Retriever]] = {
        "tfidf": TfidfRetriever,
        "bm25": BM25Retriever,
        "dense": dense,
        "hybrid": lambda: HybridRetriever([BM25Retriever(), dense()]),
        "best": lambda: best_retriever(BEST, dense=dense()),
    }
    if name not in makers:
        raise InvalidInput(f"unknown retriever {name!r}; use one of: {', '.join(RETRIEVERS)}")
    return makers[name]()


def run_queries(retriever: Retriever, col: Collection, depth: int = 1000) -> dict[str, list[str]]:
    """The top `depth` document ids for every judged query."""
    qids = [q for q in col.queries if q in col.qrels]
    return {q: [col.doc_ids[i] for i, _ in retriever.search(col.queries[q], depth)] for q in qids}


class _Searches(Protocol):
    def search(self, query: str, k: int, /) -> Sequence[Any]: ...


def queries_per_second(retriever: _Searches, queries: list[str], k: int = 100, repeats: int = 3) -> float:
    """Top-k searches per second, one query at a time (query analysis and encoding included); the
    fastest of `repeats` passes, since a shared machine's load only ever slows a pass down."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for q in queries:
            retriever.search(q, k)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best if best > 0 else float("inf")


def evaluate(retriever: Retriever, col: Collection, *, fitted: bool = False) -> dict[str, float]:
    """Fit (unless `fitted`), run every judged query, and report metrics plus timings.

    Metrics use the top 1,000 per query; `queries_per_second` times top-100 searches.
    """
    start = time.perf_counter()
    if not fitted:
        retriever.fit(col.doc_texts)
    index_seconds = time.perf_counter() - start
    out = summarize(run_queries(retriever, col), col.qrels)
    out["index_seconds"] = index_seconds
    out["queries_per_second"] = queries_per_second(retriever, [col.queries[q] for q in col.queries if q in col.qrels])
    return out


def evaluate_index(index: Index, col: Collection, depth: int = 1000) -> dict[str, float]:
    """Put the collection in `index` (one source per document id, so reruns find it unchanged and
    reuse its stored vectors), then run every judged query through `index.search`.

    A document split into several chunks is ranked by its best chunk. The index must hold only
    this collection's documents."""
    start = time.perf_counter()
    ids = set(col.doc_ids)
    other = [s for s in index.sources() if s not in ids]
    if other:
        raise InvalidInput(f"index {index.location} holds {len(other)} sources that are not documents of this "
                         f"collection (e.g. {other[0]}); use a separate index for evaluation")
    index.add_texts(zip(col.doc_ids, col.doc_texts, strict=True), markdown=False)
    qids = [q for q in col.queries if q in col.qrels]
    if qids:
        index.search(col.queries[qids[0]], 1)  # build the retriever: part of indexing
    index_seconds = time.perf_counter() - start

    def ranked(q: str) -> list[str]:
        seen: dict[str, None] = {}
        for h in index.search(q, depth):
            seen.setdefault(h.source, None)
        return list(seen)

    out = summarize({q: ranked(col.queries[q]) for q in qids}, col.qrels)
    out["index_seconds"] = index_seconds
    out["queries_per_second"] = queries_per_second(index, [col.queries[q] for q in qids])
    return out
