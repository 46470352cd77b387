"""Dense vectors for the bench collections, cached on disk so tuning reruns never re-embed.

Cache: $TETHER_BENCH_CACHE or ~/.cache/tether-bench, one .npz per (collection texts, model,
window scheme), holding whole-document vectors, window vectors with their owners, query vectors,
and the seconds each took to embed. Document vectors are handed out as an index stores them: a
document with windows has its first pass's vector (contextual windows, MiniLM) or its first
window's (dense.pool_windows).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tether.rag._dense import DenseRetriever, contextual, pool_windows
from tether.rag._evaluate import Collection


def cache_dir() -> Path:
    env = os.environ.get("TETHER_BENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tether-bench"


@dataclass
class Vectors:
    docs: np.ndarray
    windows: np.ndarray
    owner: np.ndarray
    queries: np.ndarray  # one per judged query, in `judged_ids` order
    doc_seconds: float
    window_seconds: float
    from_cache: bool


def judged_ids(col: Collection) -> list[str]:
    return [q for q in col.queries if q in col.qrels]


def collection_vectors(name: str, col: Collection, dense: DenseRetriever, *, use_cache: bool = True,
                       progress=None, pooled_only: bool = False) -> Vectors:
    """Embed (or load) documents, windows and judged queries of `col` under `dense`'s scheme.

    `pooled_only` (with windows): embed whole texts only where they have no windows (what an index
    stores, and all that windowed retrieval reads); cached apart, as `docs` then lacks the others."""
    enc = dense.embedder
    qids = judged_ids(col)
    queries = [col.queries[q] for q in qids]
    base = _key(*col.doc_texts, "\x00", *queries, enc.name)
    if pooled_only and dense.window:
        return _pooled(name, base, col, dense, queries, use_cache)
    f = cache_dir() / f"{name}-{base}.npz"
    if use_cache and f.exists():
        z = np.load(f)
        docs, qv, doc_seconds = z["docs"], z["queries"], float(z["doc_seconds"])
        cached = True
    else:
        t = time.perf_counter()
        docs = _embed(enc, col.doc_texts, progress)
        doc_seconds = time.perf_counter() - t
        qv = enc.embed(queries)
        _save(f, docs=docs, queries=qv, doc_seconds=np.array(doc_seconds))
        cached = False
    if not dense.window:
        empty = np.zeros((0, docs.shape[1]), dtype=np.float32)
        return Vectors(docs, empty, np.zeros(0, dtype=np.int64), qv, doc_seconds, 0.0, cached)
    fw = cache_dir() / f"{name}-{base}-w{dense.windows_key.replace(':', '-')}.npz"
    # a windowed document's own vector: its first pass's, i.e. its whole-text one (contextual windows),
    # else its first window's
    pool = (lambda d, w, o: d) if contextual(dense.embedder) else pool_windows
    if use_cache and fw.exists():
        z = np.load(fw)
        return Vectors(pool(docs, z["windows"], z["owner"]), z["windows"], z["owner"], qv, doc_seconds,
                       float(z["window_seconds"]), cached)
    t = time.perf_counter()
    windows, owner = dense.embed_windows(col.doc_texts)
    window_seconds = time.perf_counter() - t
    _save(fw, windows=windows, owner=owner, window_seconds=np.array(window_seconds))
    return Vectors(pool(docs, windows, owner), windows, owner, qv, doc_seconds, window_seconds, False)


def _pooled(name: str, base: str, col: Collection, dense: DenseRetriever, queries: list[str],
            use_cache: bool) -> Vectors:
    f = cache_dir() / f"{name}-{base}-w{dense.windows_key.replace(':', '-')}.npz"
    fp = cache_dir() / f"{name}-{base}-pooled.npz"
    if use_cache and f.exists():
        z = np.load(f)
        windows, owner, window_seconds = z["windows"], z["owner"], float(z["window_seconds"])
        heads = (z["rows"], z["heads"]) if "heads" in z.files else None
    else:
        t = time.perf_counter()
        if contextual(dense.embedder):  # the windowed texts' own vectors come from the same pass
            rows, own, windows, owner = dense.embed_long(col.doc_texts)
            heads = (rows, own)
        else:
            (windows, owner), heads = dense.embed_windows(col.doc_texts), None
        window_seconds = time.perf_counter() - t
        _save(f, windows=windows, owner=owner, window_seconds=np.array(window_seconds),
              **({"rows": heads[0], "heads": heads[1]} if heads is not None else {}))
    cached = use_cache and fp.exists()
    if cached:
        z = np.load(fp)
        docs, qv, doc_seconds = z["docs"], z["queries"], float(z["doc_seconds"])
    else:
        short = np.setdiff1d(np.arange(len(col.doc_texts)), owner)
        t = time.perf_counter()
        docs = np.zeros((len(col.doc_texts), dense.embedder.dim), dtype=np.float32)
        if len(short):
            docs[short] = dense.embedder.embed([col.doc_texts[i] for i in short])
        doc_seconds = time.perf_counter() - t
        qv = dense.embedder.embed(queries)
        _save(fp, docs=docs, queries=qv, doc_seconds=np.array(doc_seconds))
    if heads is None:
        return Vectors(pool_windows(docs, windows, owner), windows, owner, qv, doc_seconds, window_seconds, cached)
    docs = np.array(docs, dtype=np.float32)
    docs[heads[0]] = heads[1]
    return Vectors(docs, windows, owner, qv, doc_seconds, window_seconds, cached)


def _key(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()[:16]


def _save(f: Path, **arrays: np.ndarray) -> None:
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(f)


def _embed(enc, texts: list[str], progress) -> np.ndarray:
    embed = getattr(enc, "embed_with_progress", None)
    if progress is not None and callable(embed):
        return embed(texts, progress=progress)
    return enc.embed(texts)
