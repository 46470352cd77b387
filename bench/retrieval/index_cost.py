"""Indexing cost of a real `Index` on one collection: `python -m bench.retrieval.index_cost NAME`.

Builds an index of the collection's documents (one chunk per document) in a fresh directory,
runs one search (which fits BM25 and builds the neighbour graph), and prints one JSON line:
seconds, peak RSS and bytes on disk. Vectors come from the bench cache through an embedder that
answers known texts from it (so the seconds are the index's own work: SQLite, chunking, BM25,
vectors on disk, kNN graph); the embedding seconds measured when the cache was filled are
reported beside them. Run in its own process so the peak RSS is the index's alone.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.retrieval.embed_cache import collection_vectors
from tether.rag._dense import DenseRetriever, split_windows
from tether.rag._encoder import MiniLMEncoder
from tether.rag._evaluate import load_collection
from tether.rag._index import Index
from tether.rag._settings import BEST


class CachedTexts:
    """An embedder answering texts it was given vectors for, and embedding the rest for real."""

    def __init__(self, encoder: MiniLMEncoder, known: dict[str, np.ndarray]) -> None:
        self.encoder, self.known, self.name, self.dim = encoder, known, encoder.name, encoder.dim
        self.missed = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        todo = [i for i, t in enumerate(texts) if t not in self.known]
        for i, t in enumerate(texts):
            if t in self.known:
                out[i] = self.known[t]
        if todo:
            self.missed += len(todo)
            out[todo] = self.encoder.embed([texts[i] for i in todo])
        return out

    def piece_offsets(self, text: str) -> list[tuple[int, int]]:
        return self.encoder.piece_offsets(text)


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM; unlike ru_maxrss it is not inherited over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main(argv: list[str] | None = None) -> int:
    from bench.retrieval.__main__ import data_dir

    name = (argv or sys.argv[1:])[0]
    d = data_dir() / name
    col = load_collection(d / "corpus.jsonl", d / "queries.jsonl", d / "qrels.tsv")
    encoder = MiniLMEncoder()
    window = BEST.window
    v = collection_vectors(name, col, DenseRetriever(encoder, window=window or 126, stride=max(window // 2, 63)))
    known = dict(zip(col.doc_texts, v.docs, strict=True))
    if window:
        wins = [w for t in col.doc_texts for w in split_windows(encoder, t, window, window // 2)]
        known.update(zip(wins, v.windows, strict=True))
    emb = CachedTexts(encoder, known)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        with Index(Path(tmp) / "ix", embedder=emb, chunk_tokens=100_000, overlap=0) as idx:
            idx.add_texts(zip(col.doc_ids, col.doc_texts, strict=True), markdown=False)
            added = time.perf_counter() - start
            idx.search(next(iter(col.queries.values())), 10)
            total = time.perf_counter() - start
            chunks = len(idx)
        size = sum(f.stat().st_size for f in (Path(tmp) / "ix").iterdir())
    print(json.dumps({
        "collection": name, "documents": len(col.doc_ids), "chunks": chunks,
        "index_seconds_excluding_embedding": round(total, 2), "add_seconds": round(added, 2),
        "embedding_seconds_when_cached": round(v.doc_seconds + (v.window_seconds if window else 0.0), 1),
        "texts_embedded_here": emb.missed,
        "peak_rss_mb": peak_rss_mb(),
        "bytes_on_disk": size,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
