"""A persistent passage store: SQLite for sources and chunks, a .npy file for vectors.

Layout of an index directory:
  index.sqlite   sources (path, content hash), chunks (id, source, position, heading, text, row)
  vectors.npy    float32 [rows, dim], row i = the chunk with row = i; memory-mapped on open
  windows.npy    float32 [windows, dim], overlapping windows of chunks longer than the window
                 (dense scores a chunk by the max over its vector and its windows); memory-mapped
  window_owner.npy  int64 [windows], the chunk row each window belongs to (ascending)
  knn.npy        the neighbour graph `best` smooths over (rebuilt when the store changes)
  ivf.npz        the IVF partition, only for stores above the ANN threshold

Ingest is incremental: a source whose content hash is unchanged is skipped, a changed one has
its chunks replaced, and a file gone from an ingested folder has its chunks deleted. Only new
chunks are embedded; vectors and windows are compacted (rewritten without deleted rows) after
each change. Stored vectors are used only for the same store generation, embedder and window
scheme; otherwise everything is re-embedded once.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tether.rag.ann import IVFIndex
from tether.rag.base import Hit, Retriever
from tether.rag.chunking import Chunk, chunk_sections
from tether.rag.dense import ANN_THRESHOLD, DenseRetriever, split_windows
from tether.rag.encoder import Embedder
from tether.rag.loaders import SUPPORTED, Section, load_file
from tether.rag.settings import BEST

# Called as progress(done, total) while passages are embedded (done counts texts, windows included).
Progress = Callable[[int, int], None]

RETRIEVER_NAMES = ("tfidf", "bm25", "dense", "hybrid", "best")
DENSE_RETRIEVERS = frozenset({"dense", "hybrid", "best"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (path TEXT PRIMARY KEY, hash TEXT NOT NULL, chunks INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, position INTEGER NOT NULL,
    heading TEXT NOT NULL, text TEXT NOT NULL, row INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_source ON chunks(source);
CREATE UNIQUE INDEX IF NOT EXISTS chunks_row ON chunks(row);
"""


def default_root() -> Path:
    """Where named indexes live: $TETHER_HOME/indexes, else ~/.tether/indexes."""
    home = os.environ.get("TETHER_HOME")
    return (Path(home) if home else Path.home() / ".tether") / "indexes"


def index_path(name_or_path: str | Path) -> Path:
    """A bare name maps into `default_root()`; anything with a path separator is used as is."""
    s = str(name_or_path)
    if not s or s in {".", ".."}:
        raise ValueError("index name must not be empty")
    if os.sep in s or "/" in s:
        return Path(s).expanduser()
    return default_root() / s


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # unsupported or unreadable, with reason
    chunks_added: int = 0
    chunks_removed: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.deleted)


class Index:
    """A named, persistent passage index. `ingest` files, then `search`.

    >>> idx = Index.open("support")            # ~/.tether/indexes/support
    >>> idx.ingest("docs/")
    >>> idx.search("refund after 30 days", k=3)
    """

    def __init__(
        self,
        path: str | Path,
        *,
        retriever: str | None = None,
        embedder: Embedder | None = None,
        chunk_tokens: int = 200,
        overlap: int = 40,
        ann_threshold: int = ANN_THRESHOLD,
        window: int | None = None,
        stride: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        """`window` / `stride` (word pieces, default 126 / 63; window 0 = none) set how long chunks
        are split for dense scoring; like `chunk_tokens` they are remembered by the index, and
        changing them re-embeds the windows on the next search."""
        self.path = Path(path)
        self.progress = progress
        self.ann_threshold = ann_threshold
        self.path.mkdir(parents=True, exist_ok=True)
        # Tools run on executor threads: one connection shared under a lock.
        self._db = sqlite3.connect(self.path / "index.sqlite", check_same_thread=False)
        self._lock = threading.RLock()
        self._db.executescript(_SCHEMA)
        stored = self._meta("retriever")
        if retriever is not None and retriever not in RETRIEVER_NAMES:
            raise ValueError(f"unknown retriever {retriever!r}; use one of: {', '.join(RETRIEVER_NAMES)}")
        self.retriever_name = retriever or stored or "best"
        if stored != self.retriever_name:
            self._set_meta("retriever", self.retriever_name)
        self.chunk_tokens = int(self._meta("chunk_tokens") or chunk_tokens)
        self.overlap = int(self._meta("overlap") or overlap)
        self._set_meta("chunk_tokens", str(self.chunk_tokens))
        self._set_meta("overlap", str(self.overlap))
        default_window = str(BEST.window)
        self.window = window if window is not None else int(self._meta("window") or default_window)
        self.stride = stride if stride is not None else int(self._meta("stride") or max(self.window // 2, 1))
        DenseRetriever(window=self.window, stride=self.stride)  # validates them
        self._set_meta("window", str(self.window))
        self._set_meta("stride", str(self.stride))
        self._db.commit()
        self._embedder = embedder
        self._retriever: Retriever | None = None
        self._rows: list[Chunk] = []

    @classmethod
    def open(cls, name_or_path: str | Path, **kwargs) -> Index:
        """Open (or create) an index by name (under `default_root()`) or by directory path."""
        return cls(index_path(name_or_path), **kwargs)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata -------------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    @property
    def uses_vectors(self) -> bool:
        return self.retriever_name in DENSE_RETRIEVERS

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from tether.rag.encoder import MiniLMEncoder

            self._embedder = MiniLMEncoder()
        return self._embedder

    def _dense(self) -> DenseRetriever:
        """A dense retriever with this index's embedder, ANN threshold and window scheme."""
        return DenseRetriever(self.embedder, ann_threshold=self.ann_threshold, window=self.window,
                              stride=self.stride)

    # Reads take the lock too: on the shared connection they would see a change half applied.
    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]

    def sources(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT path FROM sources ORDER BY path")]

    def chunks(self) -> list[Chunk]:
        """Every chunk, in vector-row order."""
        with self._lock:
            rows = self._db.execute("SELECT id, source, position, heading, text FROM chunks ORDER BY row")
            return [Chunk(*r) for r in rows]

    # -- ingest ---------------------------------------------------------------------------------

    def ingest(self, path: str | Path, *, delete_missing: bool = True) -> IngestReport:
        """Add, update or (for files gone from an ingested folder) delete sources under `path`."""
        with self._lock:
            return self._ingest(path, delete_missing)

    def _ingest(self, path: str | Path, delete_missing: bool) -> IngestReport:
        root = Path(path).expanduser().resolve()
        if not root.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        report = IngestReport()
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED
                           and not any(part.startswith(".") for part in p.relative_to(root).parts))
        else:
            files = [root]
        new_chunks: list[Chunk] = []
        hashes: dict[str, str] = {}
        gone: list[str] = []
        seen: set[str] = set()
        for f in files:
            source = f.as_posix()
            seen.add(source)
            try:
                data = f.read_bytes()
                digest = hashlib.sha256(data).hexdigest()
                old = self._db.execute("SELECT hash FROM sources WHERE path = ?", (source,)).fetchone()
                if old and old[0] == digest:
                    report.unchanged.append(source)
                    continue
                chunks = chunk_sections(source, load_file(f), self.chunk_tokens, self.overlap)
            except Exception as e:  # one bad file must not stop a folder ingest
                report.skipped.append(f"{source}: {e}")
                continue
            (report.updated if old else report.added).append(source)
            if old:
                gone.append(source)
            new_chunks.extend(chunks)
            hashes[source] = digest
        if delete_missing and root.is_dir():
            prefix = root.as_posix().rstrip("/") + "/"
            for (src,) in self._db.execute("SELECT path FROM sources WHERE path LIKE ? ESCAPE '\\'",
                                           (_like_prefix(prefix),)).fetchall():
                if src not in seen:
                    gone.append(src)
                    report.deleted.append(src)
        self._apply(gone, new_chunks, report, hashes)
        return report

    def add_text(self, source: str, text: str, *, markdown: bool = True) -> IngestReport:
        """Index a text under a source name of your choice (replacing what it had)."""
        return self.add_texts([(source, text)], markdown=markdown)

    def add_texts(self, items: Iterable[tuple[str, str]], *, markdown: bool = True) -> IngestReport:
        """Index many (source name, text) pairs in one update (one embedding pass, one rewrite)."""
        with self._lock:
            return self._add_texts(list(items), markdown)

    def _add_texts(self, items: list[tuple[str, str]], markdown: bool) -> IngestReport:
        from tether.rag.loaders import parse_markdown

        report = IngestReport()
        known = dict(self._db.execute("SELECT path, hash FROM sources").fetchall())
        gone: list[str] = []
        new_chunks: list[Chunk] = []
        hashes: dict[str, str] = {}
        for source, text in items:
            digest = hashlib.sha256(text.encode()).hexdigest()
            old = known.get(source)
            if old == digest or source in hashes:
                report.unchanged.append(source)
                continue
            sections = parse_markdown(text) if markdown else [Section("", text)]
            new_chunks += chunk_sections(source, sections, self.chunk_tokens, self.overlap)
            (report.updated if old else report.added).append(source)
            if old:
                gone.append(source)
            hashes[source] = digest
        self._apply(gone, new_chunks, report, hashes)
        return report

    def remove(self, source: str | Path) -> IngestReport:
        """Delete a source (a path as ingested, or a name given to `add_text`)."""
        with self._lock:
            return self._remove(source)

    def _remove(self, source: str | Path) -> IngestReport:
        src = str(source)
        if not self._db.execute("SELECT 1 FROM sources WHERE path = ?", (src,)).fetchone():
            src = Path(source).expanduser().resolve().as_posix()
        report = IngestReport()
        if self._db.execute("SELECT 1 FROM sources WHERE path = ?", (src,)).fetchone():
            report.deleted.append(src)
            self._apply([src], [], report, {})
        return report

    def _apply(self, gone: Sequence[str], new: list[Chunk], report: IngestReport, hashes: dict[str, str]) -> None:
        """Delete the chunks of `gone` sources, insert `new` chunks, embed them, compact vectors.

        `hashes` holds the content hash of every added or updated source.
        """
        if not gone and not hashes:
            return
        old_rows = self.chunks()
        gone_set = set(gone)
        kept = [c for c in old_rows if c.source not in gone_set]
        report.chunks_removed += len(old_rows) - len(kept)
        report.chunks_added += len(new)
        stored: _Vectors | None = None
        gen = str(int(self._meta("generation") or 0) + 1)
        if self.uses_vectors:
            stored, new = self._next_vectors(old_rows, new, gone_set)
        with self._db:
            for src in gone_set:
                self._db.execute("DELETE FROM chunks WHERE source = ?", (src,))
                self._db.execute("DELETE FROM sources WHERE path = ?", (src,))
            self._db.execute("UPDATE chunks SET row = -1 - row")  # make room for renumbering
            for i, c in enumerate(kept):
                self._db.execute("UPDATE chunks SET row = ? WHERE id = ?", (i, c.id))
            self._db.executemany(
                "INSERT OR REPLACE INTO chunks(id, source, position, heading, text, row) VALUES (?, ?, ?, ?, ?, ?)",
                [(c.id, c.source, c.position, c.heading, c.text, len(kept) + i) for i, c in enumerate(new)],
            )
            for src, digest in hashes.items():
                count = sum(1 for c in new if c.source == src)
                self._db.execute("INSERT OR REPLACE INTO sources(path, hash, chunks) VALUES (?, ?, ?)",
                                 (src, digest, count))
            if stored is not None:
                self._save_vectors(stored, gen)
            self._set_meta("generation", gen)
        self._retriever = None

    # -- vectors --------------------------------------------------------------------------------

    def _next_vectors(self, old_rows: list[Chunk], new: list[Chunk], gone: set[str]) -> tuple[_Vectors, list[Chunk]]:
        """Vectors for the kept chunks followed by the `new` ones, and `new` in the order its
        vectors are in. Kept rows, and new chunks whose text is already stored (a changed file's
        untouched passages), reuse their vectors; only the rest is embedded."""
        dense = self._dense()
        old = self._load_vectors(len(old_rows))
        if old is None:  # nothing usable on disk: embed the whole store once
            kept = [c for c in old_rows if c.source not in gone]
            return _embed(dense, [c.indexed_text for c in kept + new], progress=self.progress), new
        row_of_text = {c.indexed_text: i for i, c in enumerate(old_rows)}
        take = [i for i, c in enumerate(old_rows) if c.source not in gone]
        fresh: list[Chunk] = []
        for c in new:
            if c.indexed_text in row_of_text:
                take.append(row_of_text[c.indexed_text])
            else:
                fresh.append(c)
        new = [c for c in new if c.indexed_text in row_of_text] + fresh
        reused = _select(old, np.asarray(take, dtype=np.int64))
        if not fresh:
            return reused, new
        more = _embed(dense, [c.indexed_text for c in fresh], offset=len(take), progress=self.progress)
        return _Vectors(*(np.concatenate(x) for x in zip((reused.vectors, reused.windows, reused.owner),
                                                         (more.vectors, more.windows, more.owner), strict=True))), new

    def _load_vectors(self, expected_rows: int) -> _Vectors | None:
        """The stored vectors and windows (memory-mapped), or None when missing or stale: wrong
        count, another embedder or window scheme, or saved before a change made while the index
        was open with a retriever that keeps no vectors."""
        files = [self.path / f for f in ("vectors.npy", "windows.npy", "window_owner.npy")]
        if not all(f.exists() for f in files) or self._meta("embedder") != self.embedder.name:
            return None
        if self._meta("vectors_generation") != (self._meta("generation") or "0"):
            return None
        if self._meta("vectors_windows") != self._dense().windows_key:
            return None
        vectors, windows = (np.load(f, mmap_mode="r") for f in files[:2])
        owner = np.load(files[2])
        if vectors.shape[0] != expected_rows or len(windows) != len(owner):
            return None
        if len(owner) and (owner.max() >= expected_rows or np.any(np.diff(owner) < 0)):
            return None
        return _Vectors(vectors, windows, owner)

    def _save_vectors(self, v: _Vectors, generation: str | None = None) -> None:
        """Write the vectors and windows of the store as of `generation` (default: the current one)."""
        for name, arr in (("vectors", v.vectors), ("windows", v.windows), ("window_owner", v.owner)):
            tmp = self.path / f"{name}.tmp.npy"
            np.save(tmp, np.asarray(arr, dtype=np.int64 if name == "window_owner" else np.float32))
            os.replace(tmp, self.path / f"{name}.npy")
        self._set_meta("embedder", self.embedder.name)
        self._set_meta("vectors", str(len(v.vectors)))
        self._set_meta("vectors_windows", self._dense().windows_key)
        self._set_meta("vectors_generation", generation or self._meta("generation") or "0")

    # -- search ---------------------------------------------------------------------------------

    def _build(self) -> Retriever:
        from tether.rag.evaluate import make_retriever

        self._rows = self.chunks()
        texts = [c.indexed_text for c in self._rows]
        retriever = make_retriever(self.retriever_name)
        if not self.uses_vectors:
            retriever.fit(texts)
            return retriever
        stored = self._load_vectors(len(self._rows))
        if stored is None:  # missing or stale: embed everything once and keep it
            with self._db:
                self._save_vectors(_embed(self._dense(), texts, progress=self.progress))
            stored = self._load_vectors(len(self._rows))
            assert stored is not None
        for part in _parts(retriever):
            if isinstance(part, DenseRetriever):
                part._embedder = self.embedder
                part.ann_threshold = self.ann_threshold
                part.window, part.stride = self.window, self.stride
                part.set_vectors(stored.vectors, self._ivf(stored.vectors, self.ann_threshold),
                                 windows=stored.windows, owner=stored.owner)
            else:
                part.fit(texts)
        if hasattr(retriever, "prepare"):
            retriever.prepare(self._knn_graph(retriever))  # type: ignore[attr-defined]
        return retriever

    def _vectors_key(self) -> str:
        """What files derived from the vectors (IVF, neighbour graph) are valid for: the store's
        generation and the embedder (another embedder's vectors need their own)."""
        return f"{self._meta('generation') or '0'}:{self.embedder.name}"

    def _ivf(self, vectors: np.ndarray, threshold: int) -> IVFIndex | None:
        """The IVF partition for a large store: loaded when current, else built and saved."""
        if len(vectors) <= threshold:
            return None
        f = self.path / "ivf.npz"
        gen = self._vectors_key()
        if f.exists() and self._meta("ivf_generation") == gen:
            ivf = IVFIndex.load(str(f))
            if len(ivf.assign) == len(vectors):
                return ivf
        ivf = IVFIndex.build(np.asarray(vectors))
        ivf.save(str(f))
        with self._db:
            self._set_meta("ivf_generation", gen)
        return ivf

    def _knn_graph(self, retriever: Retriever) -> np.ndarray | None:
        neighbours = getattr(retriever, "neighbours", 0)
        if not neighbours or len(self._rows) < getattr(retriever, "min_store", 0):
            return None
        f = self.path / "knn.npy"
        gen = self._vectors_key()
        if f.exists() and self._meta("knn_generation") == gen:
            graph = np.load(f)
            if graph.shape[0] == len(self._rows) and graph.shape[1] >= min(neighbours, max(len(self._rows) - 1, 0)):
                return graph
        from tether.rag.dense import knn_graph

        dense = retriever.dense  # type: ignore[attr-defined]
        graph = knn_graph(np.asarray(dense.vectors), neighbours, ivf=dense.ivf)
        np.save(f, graph)
        with self._db:
            self._set_meta("knn_generation", gen)
        return graph

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The `k` best passages for `query`, with chunk id, source, heading, text and score."""
        if not query.strip():
            raise ValueError("query must not be empty")
        with self._lock:
            if self._retriever is None:
                self._retriever = self._build()
            if not self._rows:
                return []
            return [
                Hit(pos, score, c.id, c.source, c.heading, c.text)
                for pos, score in self._retriever.search(query, k)
                for c in (self._rows[pos],)
            ]


class _Vectors(NamedTuple):
    """One vector per chunk, plus window vectors and the chunk row each belongs to."""

    vectors: np.ndarray
    windows: np.ndarray
    owner: np.ndarray


def _embed(dense: DenseRetriever, texts: list[str], offset: int = 0, progress: Progress | None = None,
           batch: int = 64) -> _Vectors:
    """Embed `texts` whole and as windows; window owners are numbered from `offset`.

    With `progress`, texts go to the embedder in batches and progress(done, total) is called after
    each (total counts whole texts plus windows)."""
    dim = dense.embedder.dim
    pieces: list[str] = []
    owner: list[int] = []
    for i, t in enumerate(texts):
        ws = split_windows(dense.embedder, t, dense.window, dense.stride)
        pieces += ws
        owner += [i] * len(ws)
    todo = list(texts) + pieces
    out = np.zeros((len(todo), dim), dtype=np.float32)
    step = batch if progress is not None else max(len(todo), 1)
    if progress is not None:
        progress(0, len(todo))
    order = np.argsort([len(t) for t in todo], kind="stable")  # similar lengths batch with less padding
    for start in range(0, len(todo), step):
        idx = order[start : start + step]
        out[idx] = dense.embedder.embed([todo[i] for i in idx])
        if progress is not None:
            progress(start + len(idx), len(todo))
    return _Vectors(out[: len(texts)], out[len(texts) :], np.asarray(owner, dtype=np.int64) + offset)


def _select(v: _Vectors, rows: np.ndarray) -> _Vectors:
    """The vectors of chunk `rows` (in that order) with their windows, owners renumbered 0..len-1."""
    ptr = np.searchsorted(v.owner, np.arange(len(v.vectors) + 1)) if len(v.owner) else None
    wins: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    if ptr is not None:
        for new_row, r in enumerate(rows):
            a, b = ptr[r], ptr[r + 1]
            if b > a:
                wins.append(np.asarray(v.windows[a:b]))
                owners.append(np.full(b - a, new_row, dtype=np.int64))
    dim = v.vectors.shape[1]
    return _Vectors(np.asarray(v.vectors[rows], dtype=np.float32).reshape(len(rows), dim),
                    np.concatenate(wins) if wins else np.zeros((0, dim), dtype=np.float32),
                    np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64))


def _parts(retriever: Retriever) -> Iterable[Retriever]:
    if hasattr(retriever, "parts"):
        return retriever.parts  # type: ignore[attr-defined]
    if hasattr(retriever, "lexical"):
        return [retriever.lexical, retriever.dense]  # type: ignore[attr-defined]
    return [retriever]


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
