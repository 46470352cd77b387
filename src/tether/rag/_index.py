"""A persistent passage store: SQLite for sources and chunks, .npy files for vectors.

Every chunk has a slot (`chunks.row`), its stable place in the store: a removed source's slots go
dead, a new chunk takes the next slot, and no other row is touched. Search positions are the live
slots in order. Once more than a quarter of the slots are dead, the store is compacted: the live
slots renumbered 0..n-1 and every per-slot file rewritten (a new generation, `meta.compacted`).

Layout of an index directory:
  index.sqlite   sources (path, content hash), chunks (id, source, position, heading, text, row =
                 slot), meta (generation, slots, the vectors' epoch and counts, ...)
  vectors.npy    float32 [slots, dim], row i = slot i (dead slots keep theirs); memory-mapped. A
                 change appends its rows in place (the header's row count is updated with the
                 commit; readers take `meta.vectors` rows); a compaction or a whole rewrite writes
                 the next epoch's files (vectors.E.npy, ...), switched with the commit.
  windows.npy    float32 [windows, dim], overlapping windows of chunks longer than the window
                 (dense scores a chunk by the max over its vector and its windows); appended alike
  window_owner.npy  int64 [windows], the slot each window belongs to (ascending)
  lexical-bm25.npz  BM25's state (live slots, document frequencies, its segment list); the
                 segments (lexical-bm25.SEGMENT.ARRAY.npy: term counts by term and by passage,
                 written once, memory-mapped) hold the postings (tether.rag._lexical)
  neighbours.npz the neighbour graph `best` smooths over, per slot, with the generation it is of
                 and the HNSW changes since its file; carried to the next generation by each change
                 (tether.rag._neighbours)
  ann-GEN.hnsw   the HNSW index as written at generation GEN, only for stores above the ANN threshold

Ingest is incremental: a source whose content hash is unchanged is skipped, a changed one has
its chunks replaced, and a file gone from an ingested folder has its chunks deleted. Only new
chunks are embedded (a changed file's untouched passages take their old slots' vectors). Stored
vectors are used only for the same embedder and window scheme; otherwise everything is
re-embedded once.

A change is committed twice: first the rows (a new generation, searchable by its words at once),
then, once embedded, its vectors. A search in between, from another process, is answered by the
lexical part of the retriever and says so (`answered_by`, `vectors_pending`); an ingest stopped in
between leaves slots without vectors, which the next ingest or search computes (only those: the
slots before them keep theirs). The BM25 state and the neighbour state follow each change at its
cost; without one for the last generation (a first ingest, a change of most of the store) the ingest
builds it whole, so the first search only loads it (the search builds it when a stopped ingest left
none).

Several processes may share an index. Writers (ingest, add, remove, a re-embedding) take
`write.lock` for their whole run, so they go one at a time and each reads what the last one
committed; the swap of vector files and rows happens under `swap.lock`, which readers take
(shared) while they read rows and open vector files, so a reader sees one generation whole.
Embeddings are checkpointed per batch (`embed_cache`), so a stopped ingest resumes where it was.
Settings given to the constructor (retriever, chunking, windows) are stored only when the index
is closed without an error, or with the first change.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tether._errors import InvalidInput, MissingFile, OperationFailed
from tether.rag._base import Hit, Retriever
from tether.rag._chunking import Chunk, chunk_sections
from tether.rag._dense import (
    ANN_THRESHOLD,
    DenseRetriever,
    contextual,
    count_windows,
    embed_in_batches,
    piece_offsets,
)
from tether.rag._encoder import Embedder
from tether.rag._lexical import BM25Retriever, _Segment
from tether.rag._loaders import SUPPORTED, Section, load_file, read_regular, refuse_special
from tether.rag._neighbours import Neighbours
from tether.rag._settings import BEST

# Called as progress(done, total) while passages are embedded (done counts passages).
Progress = Callable[[int, int], None]
# Called with a line for the user (another process holds the index, say).
Notify = Callable[[str], None]

RETRIEVER_NAMES = ("tfidf", "bm25", "dense", "hybrid", "best")
DENSE_RETRIEVERS = frozenset({"dense", "hybrid", "best"})
_SAY_BUILD = 20_000  # a neighbour state built for this many passages or more is announced (it takes seconds)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (path TEXT PRIMARY KEY, hash TEXT NOT NULL, chunks INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, position INTEGER NOT NULL,
    heading TEXT NOT NULL, text TEXT NOT NULL, row INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_source ON chunks(source);
CREATE UNIQUE INDEX IF NOT EXISTS chunks_row ON chunks(row);
CREATE TABLE IF NOT EXISTS embed_cache (key BLOB PRIMARY KEY, vec BLOB NOT NULL);
"""


def default_root() -> Path:
    """Where named indexes live: $TETHER_HOME/indexes, else ~/.tether/indexes."""
    home = os.environ.get("TETHER_HOME")
    return (Path(home) if home else Path.home() / ".tether") / "indexes"


def is_postgres_url(name_or_path: str | Path) -> bool:
    return isinstance(name_or_path, str) and name_or_path.startswith(("postgresql://", "postgres://"))


# Index classes that live elsewhere than a directory, by how their URL starts: the module of each
# registers it (tether.rag._pg_index, imported by tether.rag, adds PostgreSQL's). `Index.open` and
# `Index.exists` look a URL up here, so this module imports none of them.
BACKENDS: dict[str, type[Index]] = {}


def _backend(name_or_path: str | Path) -> type[Index] | None:
    if isinstance(name_or_path, str) and "://" in name_or_path:
        scheme = name_or_path.split("://", 1)[0]
        found = BACKENDS.get(scheme)
        if found is None:
            raise InvalidInput(f"no index backend for {scheme}:// URLs (known: "
                               f"{', '.join(sorted(BACKENDS)) or 'none'}); a local index is a name or a path")
        return found
    return None


def index_path(name_or_path: str | Path) -> Path:
    """A bare name maps into `default_root()`; anything with a path separator is used as is."""
    s = str(name_or_path)
    if not s or s in {".", ".."}:
        raise InvalidInput("index name must not be empty")
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
    files: int = 0  # supported files found under the path
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
        notify: Notify | None = None,
    ) -> None:
        """`window` / `stride` (word pieces, default 126 / 63; window 0 = none) set how long chunks
        are split for dense scoring; like `chunk_tokens` they are remembered by the index, and
        changing them re-embeds the windows on the next search."""
        if retriever is not None and retriever not in RETRIEVER_NAMES:
            raise InvalidInput(f"unknown retriever {retriever!r}; use one of: {', '.join(RETRIEVER_NAMES)}")
        self.path = Path(path)
        self.location = str(self.path)  # what messages call this index
        self.progress = progress
        self.notify = notify
        self.ann_threshold = ann_threshold
        self._db = self._connect()
        self._lock = threading.RLock()
        self._db.executescript(_SCHEMA)
        self.retriever_name = retriever or self._meta("retriever") or "best"
        self.chunk_tokens = int(self._meta("chunk_tokens") or chunk_tokens)
        self.overlap = int(self._meta("overlap") or overlap)
        default_window = str(BEST.window)
        self.window = window if window is not None else int(self._meta("window") or default_window)
        self.stride = stride if stride is not None else int(self._meta("stride") or max(self.window // 2, 1))
        DenseRetriever(window=self.window, stride=self.stride)  # validates them
        self._embedder = embedder
        self._retriever: Retriever | None = None
        self._built_generation: str | None = None
        self._slots = np.zeros(0, dtype=np.int64)  # the live slots the retriever was built on
        self._chunk_cache: list[Chunk] | None = None
        self._graph: tuple[str, Neighbours] | None = None  # the neighbour state this object saved or loaded last
        self.neighbour_builds = 0  # neighbour states this object built whole (not carried from the last generation)
        self._closed = False
        self.answered_by: str | None = None  # the retriever that ranked the last search's passages
        self.vectors_pending: str | None = None  # why that was not this index's own retriever

    @classmethod
    def open(cls, name_or_path: str | Path, **kwargs: Any) -> Index:
        """Open (or create) an index by name (under `default_root()`), by directory path, or in
        PostgreSQL by URL (`postgresql://user@host/db#name`, see tether.rag._pg_index)."""
        backend = _backend(name_or_path)
        if backend is not None:
            return backend.at_url(str(name_or_path), **kwargs)
        return cls(index_path(name_or_path), **kwargs)

    @staticmethod
    def exists(name_or_path: str | Path) -> bool:
        """Whether an index by that name, path or URL has been created."""
        backend = _backend(name_or_path)
        if backend is not None:
            return backend.exists_at(str(name_or_path))
        return (index_path(name_or_path) / "index.sqlite").exists()

    @classmethod
    def at_url(cls, url: str, **kwargs: Any) -> Index:
        """An index a backend keeps at `url` (see BACKENDS); a directory index has no URL."""
        raise InvalidInput(f"{cls.__name__} is kept in a directory, not at a URL ({url!r})")

    @classmethod
    def exists_at(cls, url: str) -> bool:
        """Whether a backend's index at `url` has been created."""
        raise InvalidInput(f"{cls.__name__} is kept in a directory, not at a URL ({url!r})")

    # -- storage: a directory with index.sqlite, flock files and array files -----------------------
    # (tether.rag._pg_index.PostgresIndex overrides these to keep the same in PostgreSQL)

    def _connect(self) -> Any:
        """The database connection (sqlite3's interface), noting what it had to create."""
        # what this object created, removed again when it is closed after an error (nothing half made)
        self._made_dir = not self.path.exists()
        self._made_db = not (self.path / "index.sqlite").exists()
        self.path.mkdir(parents=True, exist_ok=True)
        # Tools run on executor threads: one connection shared under a lock.
        conn = sqlite3.connect(self.path / "index.sqlite", check_same_thread=False, timeout=60)
        if self._made_db:  # (only before the first table: an older index keeps its freed pages for reuse)
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        return conn

    def _reclaim(self) -> None:
        """Give the pages a change freed (the embedding checkpoints, megabytes per thousand
        passages) back to the file system, in an index made with incremental auto-vacuum."""
        if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2 and self._db.execute(
                "PRAGMA freelist_count").fetchone()[0]:
            self._db.executescript("PRAGMA incremental_vacuum")  # (run to the end: `execute` frees one page)

    def _remove_created(self) -> None:
        """Remove what this object created (it is closed after an error)."""
        if self._made_dir:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self._made_db:
            for name in ("index.sqlite", "index.sqlite-journal", "write.lock", "swap.lock"):
                (self.path / name).unlink(missing_ok=True)

    def _file(self, name: str) -> Path | None:
        """A stored file (vectors, lexical state, neighbour graph) as a local path, or None."""
        f = self.path / name
        return f if f.exists() else None

    def _put_file(self, name: str, written: Path) -> None:
        """Store the file `written` (in `self.path`) as `name`, replacing it atomically."""
        os.replace(written, self.path / name)

    def _drop_files(self, prefix: str, keep: str = "") -> None:
        """Remove the stored files whose names start with `prefix`, except `keep`."""
        for f in self.path.glob(prefix + "*"):
            if f.name != keep:
                f.unlink(missing_ok=True)

    def close(self) -> None:
        """Store the settings given to the constructor, and close."""
        with self._lock:
            if self._closed:
                return
            with self._db:
                self._store_settings()
            self._db.close()
            self._closed = True

    def discard(self) -> None:
        """Close without storing the constructor's settings; an index this object created is
        removed again (a failed command leaves nothing behind) unless it holds the checkpoints of
        a stopped ingest."""
        with self._lock:
            if self._closed:
                return
            # embeddings checkpointed by a stopped ingest keep a new index: the next ingest resumes
            resumable = self.resumable
            self._db.close()
            self._closed = True
            if not resumable:
                self._remove_created()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def _store_settings(self) -> None:
        for key, value in (("retriever", self.retriever_name), ("chunk_tokens", str(self.chunk_tokens)),
                           ("overlap", str(self.overlap)), ("window", str(self.window)),
                           ("stride", str(self.stride))):
            if self._meta(key) != value:
                self._set_meta(key, value)
        self._made_dir = self._made_db = False  # stored: the index is the user's now

    # -- locks between processes ------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self, name: str, mode: int, waiting: str | None = None) -> Iterator[None]:
        """An flock on `self.path/name` (LOCK_EX or LOCK_SH) held for the block; `waiting` is said
        once when another process holds it."""
        fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting and self.notify is not None:
                    self.notify(waiting)
                fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        """The writer's lock, held from reading the store to committing the change."""
        return self._flock("write.lock", fcntl.LOCK_EX,
                           f"waiting for another process writing to the index at {self.location}")

    # -- metadata -------------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    @property
    def resumable(self) -> bool:
        """Whether a stopped ingest left embeddings to resume from."""
        with self._lock:
            return self._db.execute("SELECT 1 FROM embed_cache LIMIT 1").fetchone() is not None

    @property
    def uses_vectors(self) -> bool:
        return self.retriever_name in DENSE_RETRIEVERS

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from tether.rag._encoder import MiniLMEncoder

            self._embedder = MiniLMEncoder()
        return self._embedder

    def _dense(self) -> DenseRetriever:
        """A dense retriever with this index's embedder, ANN threshold and window scheme."""
        return DenseRetriever(self.embedder, ann_threshold=self.ann_threshold, window=self.window,
                              stride=self.stride)

    # Reads take the lock too: on the shared connection they would see a change half applied.
    def __len__(self) -> int:
        with self._lock:
            count: int = self._db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
            return count

    def sources(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT path FROM sources ORDER BY path")]

    def chunks(self) -> list[Chunk]:
        """Every chunk, in slot order (the order search positions follow)."""
        with self._lock:
            rows = self._db.execute("SELECT id, source, position, heading, text FROM chunks ORDER BY row")
            return [Chunk(*r) for r in rows]

    def _slot_count(self) -> int:
        """How many slots the store has, live or dead (a new chunk takes the next one)."""
        stored = self._meta("slots")
        if stored is not None:
            return int(stored)
        top = self._db.execute("SELECT MAX(row) FROM chunks").fetchone()[0]  # written before slots: rows 0..n-1
        return 0 if top is None else int(top) + 1

    def _live_slots(self) -> np.ndarray:
        """The slots that hold a chunk, ascending (search position i is the i-th)."""
        return np.fromiter((r for (r,) in self._db.execute("SELECT row FROM chunks ORDER BY row")), dtype=np.int64)

    @property
    def _rows(self) -> list[Chunk]:
        """The chunks of the positions the retriever was built on, read when first asked for."""
        if self._chunk_cache is None:
            with self._flock("swap.lock", fcntl.LOCK_SH):
                by_slot = {r: Chunk(*c) for r, *c in self._db.execute(
                    "SELECT row, id, source, position, heading, text FROM chunks ORDER BY row")}
            gone = Chunk("", "", 0, "", "")  # removed since (the next search rebuilds)
            self._chunk_cache = [by_slot.get(s, gone) for s in self._slots.tolist()]
        return self._chunk_cache

    # -- ingest ---------------------------------------------------------------------------------

    def ingest(self, path: str | Path, *, delete_missing: bool = True) -> IngestReport:
        """Add, update or (for files gone from an ingested folder) delete sources under `path`."""
        root = Path(path).expanduser().resolve()
        if not root.exists():
            raise MissingFile(f"{path}: no such file or folder")
        if not root.is_dir():
            refuse_special(root)  # a FIFO, socket or device: refused before it is opened
        with self._lock, self._writing():
            return self._ingest(root, delete_missing)

    def _ingest(self, root: Path, delete_missing: bool) -> IngestReport:
        report = IngestReport()
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED
                           and not any(part.startswith(".") for part in p.relative_to(root).parts))
        else:
            files = [root]
        report.files = len(files)
        new_chunks: list[Chunk] = []
        hashes: dict[str, str] = {}
        gone: list[str] = []
        seen: set[str] = set()
        for f in files:
            source = f.as_posix()
            seen.add(source)
            try:
                data = read_regular(f)
                digest = hashlib.sha256(data).hexdigest()
                old = self._db.execute("SELECT hash FROM sources WHERE path = ?", (source,)).fetchone()
                if old and old[0] == digest:
                    report.unchanged.append(source)
                    continue
                chunks = chunk_sections(source, load_file(f, data), self.chunk_tokens, self.overlap)
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
        items = list(items)
        with self._lock, self._writing():
            return self._add_texts(items, markdown)

    def _add_texts(self, items: list[tuple[str, str]], markdown: bool) -> IngestReport:
        from tether.rag._loaders import parse_markdown

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
        with self._lock, self._writing():
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
        """Delete the chunks of `gone` sources and insert `new` chunks in one commit (searchable by
        their words from then on), then embed what has no vector yet and store the new vectors in a
        second commit. `hashes` holds the content hash of every added or updated source."""
        if not gone and not hashes:
            if self.uses_vectors:
                self._complete_vectors()  # a stopped ingest's passages may still wait for vectors
            return
        gone_set = set(gone)
        # Per-source bookkeeping costs the change, not the store: the chunks of the gone sources are
        # read by source (indexed); their slots go dead, the new chunks take new slots at the end,
        # and no other row is touched.
        gone_chunks = sorted((r, Chunk(*c)) for src in gone_set for r, *c in self._db.execute(
            "SELECT row, id, source, position, heading, text FROM chunks WHERE source = ?", (src,)))
        dropped = [r for r, _ in gone_chunks]
        report.chunks_removed += len(dropped)
        report.chunks_added += len(new)
        start = self._slot_count()
        per_source = Counter(c.source for c in new)
        gen = str(int(self._meta("generation") or 0) + 1)
        with self._flock("swap.lock", fcntl.LOCK_EX), self._db:
            self._store_settings()
            for src in gone_set:
                self._db.execute("DELETE FROM chunks WHERE source = ?", (src,))
                self._db.execute("DELETE FROM sources WHERE path = ?", (src,))
            self._db.executemany(
                "INSERT OR REPLACE INTO chunks(id, source, position, heading, text, row) VALUES (?, ?, ?, ?, ?, ?)",
                [(c.id, c.source, c.position, c.heading, c.text, start + i) for i, c in enumerate(new)],
            )
            self._db.executemany("INSERT OR REPLACE INTO sources(path, hash, chunks) VALUES (?, ?, ?)",
                                 [(src, digest, per_source[src]) for src, digest in hashes.items()])
            self._rows_written([c.id for _, c in gone_chunks], new)
            self._set_meta("slots", str(start + len(new)))
            self._set_meta("generation", gen)
        self._update_lexical(dropped, new, gen)
        self._retriever = None
        if self.uses_vectors:
            # a changed file's untouched passages take the vectors of their old slots
            stored = self._embed_missing(gen, {c.indexed_text: r for r, c in gone_chunks}, changed=len(hashes))
            self._update_neighbours(dropped, start, gen, stored)
        self._compact_if_sparse()
        self._retriever = None

    def _rows_written(self, gone: list[str], new: list[Chunk]) -> None:
        """Called in the transaction that stores a change's rows, after they are written (`gone`: the
        ids of the chunks it deleted); a backend that keeps more per row (PostgreSQL's terms) does
        the same to it here."""

    # -- the lexical state (BM25's segments, tether.rag._lexical), carried per generation ---------

    def _update_lexical(self, dropped: list[int], new: list[Chunk], gen: str) -> None:
        """Carry a stored lexical state (BM25's) from the last generation to `gen`: the slots
        `dropped` dead, the `new` chunks tokenized into one new segment. Without a state for the last
        generation (a first ingest) it fits one on all chunks, so the first search only loads it."""
        from tether.rag._evaluate import make_retriever

        for part in retriever_parts(make_retriever(self.retriever_name)):
            if not isinstance(part, BM25Retriever):
                continue
            if not self._restore_bm25(part, str(int(gen) - 1)) or part.slots != self._slot_count() - len(new):
                by_slot = [(r, Chunk(*c)) for r, *c in self._db.execute(
                    "SELECT row, id, source, position, heading, text FROM chunks ORDER BY row")]
                part.fit([c.indexed_text for _, c in by_slot], slots=np.asarray([r for r, _ in by_slot], dtype=np.int64))
                self._save_bm25(part, gen, None)
                continue
            before = {seg.name for seg in part.segments}
            part.update(dropped, [c.indexed_text for c in new])
            self._save_bm25(part, gen, before)

    def _bm25_name(self, part: BM25Retriever, segment: str = "", array: str = "") -> str:
        """lexical-bm25.npz (the state: live slots, document frequencies, segment list), or a
        segment's array lexical-bm25.SEGMENT.ARRAY.npy (written once, memory-mapped on load)."""
        return f"lexical-{part.name}.{segment}.{array}.npy" if segment else f"lexical-{part.name}.npz"

    def _restore_bm25(self, part: BM25Retriever, gen: str) -> bool:
        """Take the BM25 state stored for generation `gen`, if there is one."""
        name = self._bm25_name(part)
        with self._flock("swap.lock", fcntl.LOCK_SH):
            if self._meta(name) != f"{gen}:{part.key()}" or (f := self._file(name)) is None:
                return False
            with np.load(f, allow_pickle=False) as z:
                state = dict(z)

            def segment(seg: str) -> dict[str, np.ndarray]:
                files = {a: self._file(self._bm25_name(part, seg, a)) for a in _Segment.ARRAYS}
                if None in files.values():
                    raise MissingFile(seg)
                return {a: np.load(f, mmap_mode="r", allow_pickle=False) for a, f in files.items() if f is not None}

            try:
                part.restore(state, segment)
            except (FileNotFoundError, KeyError, ValueError):  # a state half replaced by a stopped writer
                part.fit([])
                return False
        return True

    def _save_bm25(self, part: BM25Retriever, gen: str, before: set[str] | None) -> None:
        """Store `part` as the BM25 state of `gen` if the store is still at it: the segments not in
        `before` (the stored ones; None: none are) written, the ones merged away removed."""
        tmps: list[tuple[str, Path]] = []
        stem = f"{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            for seg in part.segments:
                if before is not None and seg.name in before:
                    continue
                for a, arr in seg.arrays().items():
                    tmp = self.path / f"{stem}.{self._bm25_name(part, seg.name, a)}"  # (not under the prefix dropped below)
                    np.save(tmp, np.asarray(arr))
                    tmps.append((self._bm25_name(part, seg.name, a), tmp))
            state = self.path / f"{stem}.{self._bm25_name(part)}"
            arrays: dict[str, Any] = part.state()
            with open(state, "wb") as fh:
                np.savez(fh, **arrays)
            tmps.append((self._bm25_name(part), state))
            with self._flock("swap.lock", fcntl.LOCK_EX):
                if (self._meta("generation") or "0") != gen:
                    return  # another process changed the store meanwhile: its readers fit their own
                current = {seg.name for seg in part.segments}
                if before is None:
                    self._drop_files(f"lexical-{part.name}.")
                for name, tmp in tmps:
                    self._put_file(name, tmp)
                with self._db:
                    self._set_meta(self._bm25_name(part), f"{gen}:{part.key()}")
                for merged in (before or set()) - current:
                    self._drop_files(f"lexical-{part.name}.{merged}.")
        finally:
            for _, tmp in tmps:
                tmp.unlink(missing_ok=True)

    # -- vectors: one row per slot, appended in place by each change --------------------------------

    _KINDS = ("vectors", "windows", "window_owner")

    @staticmethod
    def _array_name(kind: str, epoch: str) -> str:
        """The file of `kind` in vector epoch `epoch` (a compaction or a whole rewrite starts the next)."""
        return f"{kind}.npy" if epoch == "0" else f"{kind}.{epoch}.npy"

    def _appends_in_place(self) -> bool:
        """Whether the array files are local files this object may append to (a backend that keeps
        them elsewhere, PostgreSQL's, stores each change's arrays whole)."""
        return type(self)._file is Index._file and type(self)._put_file is Index._put_file

    def _complete_vectors(self) -> None:
        """Embed and store the vectors of the slots that have none (an ingest stopped between its
        two commits, another embedder or window scheme). The caller holds write.lock."""
        gen = self._meta("generation") or "0"
        stored = self._embed_missing(gen) if self._load_vectors() is None else None
        self._update_neighbours([], -1, gen, stored)  # (-1: none carried; built unless stored for `gen`)

    def _embed_missing(self, gen: str, reuse: dict[str, int] | None = None, changed: int = 0) -> _Vectors | None:
        """Store vectors for every slot after the last one that has them (all, when none are usable):
        a chunk whose text is in `reuse` takes that slot's, the others are embedded (through the
        checkpoints), dead slots get zeros. Reads only the chunks of those slots. Returns all
        vectors when it holds them in memory (written whole), else None."""
        have = self._load_vectors(complete=False)
        first = len(have.vectors) if have is not None else 0
        total = self._slot_count()
        todo = [(r, Chunk(*c)) for r, *c in self._db.execute(
            "SELECT row, id, source, position, heading, text FROM chunks WHERE row >= ? ORDER BY row", (first,))]
        reuse = {t: s for t, s in (reuse or {}).items() if s < first}
        fresh = [(r, c) for r, c in todo if c.indexed_text not in reuse]
        if self.notify is not None and fresh and changed:
            windows = count_windows(self.embedder, [c.indexed_text for _, c in fresh], self.window, self.stride)
            what = (f"{len(fresh)} passages to embed (their {windows} window vectors pooled from the same pass)"
                    if contextual(self.embedder) else f"{len(fresh)} passages and {windows} windows to embed")
            self.notify(f"{changed} documents changed: {what}; searches answer from their words meanwhile")
        more = _embed(self._dense(), [c.indexed_text for _, c in fresh], progress=self._progress(), cache=self._cache())
        dim = self.embedder.dim
        vectors = np.zeros((total - first, dim), dtype=np.float32)
        windows_parts: list[np.ndarray] = [np.zeros((0, dim), dtype=np.float32)]
        owner_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
        fresh_at = {r: i for i, (r, _) in enumerate(fresh)}
        more_ptr = np.searchsorted(more.owner, np.arange(len(fresh) + 1))
        have_ptr = np.searchsorted(have.owner, np.arange(first + 1)) if have is not None else np.zeros(1, dtype=np.int64)
        for r, c in todo:
            if r in fresh_at:
                i = fresh_at[r]
                vectors[r - first] = more.vectors[i]
                w = more.windows[more_ptr[i] : more_ptr[i + 1]]
            else:
                assert have is not None
                s = reuse[c.indexed_text]
                vectors[r - first] = have.vectors[s]
                w = np.asarray(have.windows[have_ptr[s] : have_ptr[s + 1]])
            windows_parts.append(np.asarray(w, dtype=np.float32))
            owner_parts.append(np.full(len(w), r, dtype=np.int64))
        return self._store_vectors(_Vectors(vectors, np.concatenate(windows_parts), np.concatenate(owner_parts)), have, gen)

    def _store_vectors(self, new: _Vectors, have: _Vectors | None, generation: str) -> _Vectors | None:
        """Store the vectors `new` of the slots after `have`'s as those of `generation`: appended to
        the files in place (returns None), or (another backend, a file not appendable) all written
        anew (returns them)."""
        if have is not None and len(have.vectors) and self._appends_in_place() and self._append_vectors(new, have, generation):
            return None
        whole = self._joined(have, new, generation)
        tmps = self._write_arrays(whole)
        try:
            with self._flock("swap.lock", fcntl.LOCK_EX), self._db:
                self._switch_vectors(tmps, whole, generation)
                self._db.execute("DELETE FROM embed_cache")
            self._reclaim()
            self._drop_old_arrays()
        finally:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
        return whole

    def _joined(self, have: _Vectors | None, new: _Vectors, generation: str) -> _Vectors:
        """The vectors `have` followed by `new` (the slots after them) of `generation`."""
        return new if have is None else _Vectors(*(np.concatenate([np.asarray(a), b]) for a, b in zip(have, new, strict=True)))

    def _append_vectors(self, new: _Vectors, have: _Vectors, generation: str) -> bool:
        """Append `new` after `have` in the current files: the rows written past the stored ones
        first (no reader maps them), then, with the commit, each file's header. False (nothing
        changed) when a file's header cannot grow in place."""
        epoch = self._meta("vectors_epoch") or "0"
        plans: list[tuple[Path, int, np.ndarray, bytes]] = []
        for kind, old, arr in zip(self._KINDS, have, new, strict=True):
            path = self.path / self._array_name(kind, epoch)
            arr = np.ascontiguousarray(arr, dtype=np.int64 if kind == "window_owner" else np.float32)
            with open(path, "rb") as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(fh)
                offset = fh.tell()
            if fortran or dtype != arr.dtype or tuple(shape[1:]) != arr.shape[1:] or shape[0] < len(old):
                return False
            header = io.BytesIO()
            write = np.lib.format.write_array_header_1_0 if version == (1, 0) else np.lib.format.write_array_header_2_0
            write(header, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                           "shape": (len(old) + len(arr), *shape[1:])})
            if len(header.getvalue()) != offset:
                return False
            plans.append((path, offset + len(old) * dtype.itemsize * int(np.prod(shape[1:])), arr, header.getvalue()))
        for path, at, arr, _ in plans:
            with open(path, "r+b") as fh:
                fh.seek(at)
                fh.write(arr.tobytes())
                fh.truncate()
        with self._flock("swap.lock", fcntl.LOCK_EX), self._db:
            for path, _, _, head in plans:
                with open(path, "r+b") as fh:
                    fh.write(head)
            self._vector_meta(len(have.vectors) + len(new.vectors), len(have.windows) + len(new.windows), generation)
            self._db.execute("DELETE FROM embed_cache")
        self._reclaim()
        return True

    def _write_arrays(self, v: _Vectors) -> list[Path]:
        """`v` written to temporary files (vectors, windows, owners), for `_switch_vectors`."""
        out = []
        for kind, arr in zip(self._KINDS, v, strict=True):
            tmp = self.path / f"{kind}.{os.getpid()}.{threading.get_ident()}.tmp.npy"
            np.save(tmp, np.asarray(arr, dtype=np.int64 if kind == "window_owner" else np.float32))
            out.append(tmp)
        return out

    def _switch_vectors(self, tmps: list[Path], v: _Vectors, generation: str) -> None:
        """In the swap lock and a transaction: the files `tmps` (holding `v`) become the arrays of
        the next epoch, valid for `generation`."""
        epoch = str(int(self._meta("vectors_epoch") or 0) + 1)
        for kind, tmp in zip(self._KINDS, tmps, strict=True):
            self._put_file(self._array_name(kind, epoch), tmp)
        self._set_meta("vectors_epoch", epoch)
        self._vector_meta(len(v.vectors), len(v.windows), generation)

    def _drop_old_arrays(self) -> None:
        epoch = self._meta("vectors_epoch") or "0"
        for kind in self._KINDS:
            self._drop_files(f"{kind}.", keep=self._array_name(kind, epoch))

    def _vector_meta(self, vectors: int, windows: int, generation: str) -> None:
        self._set_meta("embedder", self.embedder.name)
        self._set_meta("vectors", str(vectors))
        self._set_meta("windows", str(windows))
        self._set_meta("vectors_windows", self._dense().windows_key)
        self._set_meta("vectors_generation", generation)
        self._db.execute("DELETE FROM meta WHERE key = 'vectors_progress'")

    def _progress(self) -> Progress:
        """progress(done, total) that also records how far the vectors are, for other processes'
        searches (`vectors_pending`), then calls the user's `progress`."""
        def report(done: int, total: int) -> None:
            with self._db:
                self._set_meta("vectors_progress", f"{done}/{total}")
            if self.progress is not None:
                self.progress(done, total)
        return report

    def _writer_active(self) -> bool:
        """Whether a writer (another process, or another Index object) holds write.lock now."""
        fd = os.open(self.path / "write.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def _load_vectors(self, complete: bool = True) -> _Vectors | None:
        """The stored vectors and windows per slot (memory-mapped), or None when missing or unusable:
        another embedder or window scheme, a damaged file, or (`complete`) not covering every slot of
        the current generation; with `complete=False`, those of the first slots that have them."""
        if self._meta("embedder") != self.embedder.name:
            return None
        if self._meta("vectors_windows") != self._dense().windows_key:
            return None
        if complete and self._meta("vectors_generation") != (self._meta("generation") or "0"):
            return None
        epoch = self._meta("vectors_epoch") or "0"
        found = [self._file(self._array_name(kind, epoch)) for kind in self._KINDS]
        if None in found:
            return None
        files = [f for f in found if f is not None]
        try:
            vectors, windows, owner = (np.load(f, mmap_mode="r", allow_pickle=False) for f in files)
        except ValueError:  # not an array file
            return None
        n = int(self._meta("vectors") or -1)
        w = int(self._meta("windows") or len(owner))  # (an index from before appends: the files' own)
        if n < 0 or len(vectors) < n or len(windows) < w or len(owner) < w or (complete and n != self._slot_count()):
            return None
        vectors, windows, owner = vectors[:n], windows[:w], np.asarray(owner[:w])
        if len(owner) and (owner.min() < 0 or owner.max() >= n or np.any(np.diff(owner) < 0)):
            return None
        return _Vectors(vectors, windows, owner)

    # -- compaction: slots renumbered once a quarter of them are dead ---------------------------

    def _compact_if_sparse(self) -> None:
        """When more than a quarter of the slots are dead, renumber the live ones 0..n-1 (in order)
        and rewrite what is kept per slot: the rows, the vectors (in the same commit), then the BM25
        state and the neighbour state of the new generation. Costs the store, once per so many
        removals that it is a constant per removed chunk. The caller holds write.lock."""
        from tether.rag._evaluate import make_retriever

        total = self._slot_count()
        if (total - len(self)) * 4 <= total:
            return
        live = self._live_slots()
        gen = self._meta("generation") or "0"
        new_gen = str(int(gen) + 1)
        retriever = make_retriever(self.retriever_name)
        lexical = [p for p in retriever_parts(retriever) if isinstance(p, BM25Retriever) and self._restore_bm25(p, gen)]
        k = self._graph_k(retriever)
        have = self._load_vectors(complete=False)
        graph = None
        if have is not None and (k or len(live) > self.ann_threshold):
            graph = self._load_neighbours(self._neighbours_key(gen, len(live) > self.ann_threshold, k), have.vectors)
        tmps: list[Path] = []
        kept: _Vectors | None = None
        complete = False
        if have is not None:
            complete = self._meta("vectors_generation") == gen and len(have.vectors) == total
            kept = _select(have, live[live < len(have.vectors)])
            tmps = self._write_arrays(kept)
        try:
            with self._flock("swap.lock", fcntl.LOCK_EX), self._db:
                self._close_gaps(np.setdiff1d(np.arange(total), live).tolist())
                self._set_meta("slots", str(len(live)))
                self._set_meta("generation", new_gen)
                self._set_meta("compacted", new_gen)
                if kept is not None:
                    self._switch_vectors(tmps, kept, new_gen if complete else (self._meta("vectors_generation") or ""))
            if kept is not None:
                self._drop_old_arrays()
        finally:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
        for part in lexical:
            self._save_bm25(part.compacted(), new_gen, None)
        if graph is not None and len(graph.rows) == total and kept is not None and len(kept.vectors) == len(live):
            graph.compact(live)
            self._save_neighbours(graph, self._neighbours_key(new_gen, graph.ann is not None, k), new_gen)

    def _close_gaps(self, dropped: list[int]) -> None:
        """Renumber the rows left after deleting rows `dropped` (ascending) to 0..n-1, in order: each
        run between two deleted rows moves down by the deleted rows before it, one range update per
        run (negated first, as the row column is unique)."""
        if not dropped:
            return
        for shift, (lo, hi) in enumerate(zip(dropped, [*dropped[1:], None], strict=True), start=1):
            if hi is None:
                self._db.execute("UPDATE chunks SET row = -1 - (row - ?) WHERE row > ?", (shift, lo))
            elif hi > lo + 1:
                self._db.execute("UPDATE chunks SET row = -1 - (row - ?) WHERE row > ? AND row < ?", (shift, lo, hi))
        self._db.execute("UPDATE chunks SET row = -1 - row WHERE row < 0")

    # -- search ---------------------------------------------------------------------------------

    def _cache(self) -> _EmbedCache:
        return _EmbedCache(self._db)

    def _snapshot(self) -> tuple[np.ndarray, str, _Vectors | None]:
        """The live slots, their generation and (for a dense retriever) the stored vectors, read
        under the shared swap lock: all of one generation."""
        with self._flock("swap.lock", fcntl.LOCK_SH):
            slots = self._live_slots()
            gen = self._meta("generation") or "0"
            return slots, gen, self._load_vectors() if self.uses_vectors else None

    def _build(self) -> Retriever:
        from tether.rag._evaluate import make_retriever

        slots, gen, stored = self._snapshot()
        if self.uses_vectors and stored is None:  # missing or stale
            if self._writer_active():  # an ingest is computing them: answer from the words meanwhile
                return self._lexical_meanwhile(slots, gen)
            with self._writing():  # else compute them once, and keep them
                self._complete_vectors()
                slots, gen, stored = self._snapshot()
            assert stored is not None
        self._slots, self._built_generation, self._chunk_cache = slots, gen, None
        self.answered_by, self.vectors_pending = self.retriever_name, None
        retriever = make_retriever(self.retriever_name)
        if not self.uses_vectors:
            self._lexical(retriever)
            return retriever
        assert stored is not None
        state = self._neighbours(stored.vectors, self._graph_k(retriever), slots)
        for part in retriever_parts(retriever):
            if isinstance(part, DenseRetriever):
                part._embedder = self.embedder
                part.ann_threshold = self.ann_threshold
                part.window, part.stride = self.window, self.stride
                part.set_vectors(stored.vectors, state.ann if state else None, windows=stored.windows,
                                 owner=stored.owner, live=None if len(slots) == len(stored.vectors) else slots)
            else:
                self._lexical(part)
        if hasattr(retriever, "prepare"):
            graph = state.positions(slots) if state is not None and state.k else None
            retriever.prepare(graph if len(slots) >= getattr(retriever, "min_store", 0) else None)  # pyright: ignore[reportAttributeAccessIssue]
        return retriever

    def _lexical_meanwhile(self, slots: np.ndarray, gen: str) -> Retriever:
        """The lexical part of this index's retriever (BM25 for `dense`), for a store whose vectors
        another process is still computing; `vectors_pending` says how far it is."""
        from tether.rag._evaluate import make_retriever

        lexical = next((p for p in retriever_parts(make_retriever(self.retriever_name))
                        if not isinstance(p, DenseRetriever)), None) or make_retriever("bm25")
        self._slots, self._built_generation, self._chunk_cache = slots, gen, None
        self._lexical(lexical)
        done, _, total = (self._meta("vectors_progress") or "").partition("/")
        self.answered_by = lexical.name
        self.vectors_pending = (f"{self.retriever_name} is not ready: its vectors are being computed"
                                + (f" ({done} of {total} passages)" if total else "")
                                + f"; answered by {lexical.name} meanwhile")
        return lexical

    def _vectors_key(self) -> str:
        """What files derived from the vectors (IVF, neighbour graph) are valid for: the store's
        generation and the embedder (another embedder's vectors need their own)."""
        return f"{self._built_generation or '0'}:{self.embedder.name}"

    def _lexical(self, part: Retriever) -> None:
        """Make a lexical retriever ready for the built generation: its stored state taken back, or
        fitted on the chunks' texts (and stored)."""
        if (isinstance(part, BM25Retriever) and self._restore_bm25(part, self._built_generation or "0")
                and np.array_equal(part.positions, self._slots)):
            return
        self._fit_lexical(part, [c.indexed_text for c in self._rows])

    def _fit_lexical(self, part: Retriever, texts: list[str]) -> None:
        """Fit a lexical retriever on `texts` (the built positions'), or take its state as stored for
        this generation (tokenizing and stemming a large store takes seconds; every process
        searching it did that again), and store what was fitted."""
        if isinstance(part, BM25Retriever):
            part.fit(texts, slots=self._slots)
            self._save_bm25(part, self._built_generation or "0", None)
            return
        if not hasattr(part, "arrays"):
            part.fit(texts)
            return
        name = f"lexical-{part.name}.npz"
        key = f"{self._built_generation or '0'}:{part.key()}"  # type: ignore[attr-defined]
        with self._flock("swap.lock", fcntl.LOCK_SH):
            if (f := self._file(name)) is not None and self._meta(name) == key:
                with np.load(f, allow_pickle=False) as stored:
                    part.restore(dict(stored))  # type: ignore[attr-defined]
                return
        part.fit(texts)
        self._save_derived(name, name, lambda path: np.savez(path, **part.arrays()), key)  # pyright: ignore[reportAttributeAccessIssue]

    def _save_derived(self, name: str, meta_key: str, write: Callable[[str], None], key: str | None = None) -> None:
        """Write a file derived from the vectors (`write(path)`), if the store is still at the
        generation it was built from: to a temporary name, renamed into place under the swap lock."""
        tmp = self.path / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        write(str(tmp))
        written = next(self.path.glob(tmp.name + "*"))  # numpy appends its suffix
        try:
            with self._flock("swap.lock", fcntl.LOCK_EX):
                if (self._meta("generation") or "0") != self._built_generation:
                    return  # another process changed the store meanwhile: its readers build their own
                self._put_file(name, written)
                with self._db:
                    self._set_meta(meta_key, key or self._vectors_key())
        finally:
            written.unlink(missing_ok=True)

    # -- the neighbour state (tether.rag._neighbours): carried per generation, rebuilt only without one

    @staticmethod
    def _graph_k(retriever: Retriever) -> int:
        """How many neighbours per passage `retriever` smooths over (0: none)."""
        return int(getattr(retriever, "neighbours", 0) or 0) if getattr(retriever, "gain", 0) else 0

    def _neighbours_key(self, generation: str, ann: bool, k: int) -> str:
        """What a stored neighbour state is valid for: the generation, the embedder, `k`, and
        whether it has an HNSW index (the store is above the ANN threshold)."""
        return f"{generation}:{self.embedder.name}:{k}:{'ann' if ann else 'exact'}"

    def _load_neighbours(self, key: str, vectors: np.ndarray) -> Neighbours | None:
        """The neighbour state saved for `key` (its file names its own key, so a state replaced
        halfway by a stopped writer is never taken for another generation's): this object's own if
        it saved or loaded it last (a writer searching what it wrote reads nothing), else the stored
        one, its HNSW log replayed on `vectors`."""
        if self._graph is not None and self._graph[0] == key:
            return self._graph[1]
        with self._flock("swap.lock", fcntl.LOCK_SH):
            f = self._file("neighbours.npz")
            if f is None:
                return None
            stored_key, ann_name = Neighbours.stored_key(f)
            if stored_key != key:
                return None
            ann_file = self._file(ann_name) if ann_name else None
            if ann_name and ann_file is None:
                return None
            state = Neighbours.load(f, ann_file, vectors)
        self._graph = (key, state)
        return state

    def _neighbours(self, vectors: np.ndarray, k: int, live: np.ndarray) -> Neighbours | None:
        """The neighbour state of the current generation (per slot): loaded, else built and saved."""
        use_ann = len(live) > self.ann_threshold
        if not k and not use_ann:
            return None
        key = self._neighbours_key(self._built_generation or "0", use_ann, k)
        state = self._load_neighbours(key, vectors)
        if state is not None and len(state.rows) == len(vectors):
            return state
        state = self._build_neighbours(vectors, k, use_ann, live, self._built_generation or "0")
        return self._load_neighbours(key, vectors) or state

    def _build_neighbours(self, vectors: np.ndarray, k: int, use_ann: bool, live: np.ndarray, generation: str) -> Neighbours:
        """Build the neighbour state of `generation` whole and store it (a first ingest, a large
        change, a search that finds none); says so first when it takes a while."""
        if self.notify is not None and len(live) >= _SAY_BUILD:
            self.notify(f"building the neighbour graph of {len(live)} passages"
                        + (" and its HNSW index" if use_ann else "") + " (once per large change)")
        self.neighbour_builds += 1
        state = Neighbours.build(vectors, k, use_ann, live)
        self._save_neighbours(state, self._neighbours_key(generation, use_ann, k), generation)
        return state

    def _stored_neighbours_key(self) -> str | None:
        """The key the stored neighbour state was saved for (None: none stored)."""
        with self._flock("swap.lock", fcntl.LOCK_SH):
            f = self._file("neighbours.npz")
            return Neighbours.stored_key(f)[0] if f is not None else None

    def _save_neighbours(self, state: Neighbours, key: str, generation: str) -> None:
        """Store `state` for `generation` if the store is still at it: the HNSW file under a name of
        its generation first (when due: else the state's log of changes since the last one is kept),
        then neighbours.npz (the switch), then older HNSW files removed."""
        self._graph = None
        rebase = state.rebase_due
        ann_name = (f"ann-{generation}.hnsw" if rebase else state.base) if state.ann is not None else ""
        stem = self.path / f"neighbours.{os.getpid()}.{threading.get_ident()}"
        tmp_npz, tmp_ann = stem.with_suffix(".npz.tmp"), stem.with_suffix(".hnsw.tmp")
        try:
            state.save(tmp_npz, key, ann_name)
            if state.ann is not None and rebase:
                state.ann.save(tmp_ann)
            with self._flock("swap.lock", fcntl.LOCK_EX):
                if (self._meta("generation") or "0") != generation:
                    return  # another process changed the store meanwhile: its readers build their own
                if state.ann is not None and rebase:
                    self._put_file(ann_name, tmp_ann)
                self._put_file("neighbours.npz", tmp_npz)
                self._drop_files("ann-", keep=ann_name)
            # A written HNSW index is taken back from its file: hnswlib does not store its level
            # generator, so every process must continue from the file, this one too, for the same
            # changes to give the same graph everywhere.
            self._graph = None if rebase and state.ann is not None else (key, state)
        finally:
            tmp_npz.unlink(missing_ok=True)
            tmp_ann.unlink(missing_ok=True)

    def _update_neighbours(self, dropped: list[int], old_slots: int, generation: str, stored: _Vectors | None = None) -> None:
        """Carry the neighbour state of the last generation to `generation` (slots `dropped` dead,
        the slots from `old_slots` on new), if there is one for the same settings; else (a first
        ingest, a change of more than half the store) build it whole here, so that the ingest pays
        for it and not the first search."""
        from tether.rag._evaluate import make_retriever

        k = self._graph_k(make_retriever(self.retriever_name))
        live = self._live_slots()
        use_ann = len(live) > self.ann_threshold
        if not k and not use_ann:
            return
        if old_slots < 0 and self._stored_neighbours_key() == self._neighbours_key(generation, use_ann, k):
            return  # (a stopped ingest run again: its state was stored)
        stored = stored if stored is not None else self._load_vectors()  # (appended: memory-mapped again)
        if stored is None:
            return
        prev = None if old_slots < 0 else self._load_neighbours(
            self._neighbours_key(str(int(generation) - 1), use_ann, k), stored.vectors)
        added = len(stored.vectors) - old_slots
        if (prev is None or len(prev.rows) != old_slots
                or prev.k < min(k, len(live) - 1)  # built when the store had fewer than k + 1 passages
                or 2 * (added + 2 * len(dropped)) > len(live) - added + len(dropped)):  # (dropped ones count at both ends)
            self._build_neighbours(stored.vectors, k, use_ann, live, generation)
            return
        self._graph = None  # changed in place below: not the last generation's any more
        prev.update(stored.vectors, np.asarray(dropped, dtype=np.int64), live)
        self._save_neighbours(prev, self._neighbours_key(generation, use_ann, k), generation)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The `k` best passages for `query`, with chunk id, source, heading, text and score.

        `answered_by` then names the retriever that ranked them; `vectors_pending` is a note when
        that was not the index's own (its vectors are still being computed), else None."""
        if not query.strip():
            raise InvalidInput("query must not be empty")
        with self._lock:
            for _ in range(5):
                stale = self._retriever is None or (self._meta("generation") or "0") != self._built_generation
                if not stale and self.vectors_pending:  # the vectors are done, or their writer is gone
                    stale = self._meta("vectors_generation") == self._built_generation or not self._writer_active()
                retriever = self._retriever = self._build() if stale or self._retriever is None else self._retriever
                if not len(self._slots):
                    return []
                hits = self._hits(retriever.search(query, k))
                if hits is not None:
                    return hits
                self._retriever = None  # compacted meanwhile: the slots were renumbered
            raise OperationFailed(f"the index at {self.location} kept changing while it was searched; try again")

    def _hits(self, found: list[tuple[int, float]]) -> list[Hit] | None:
        """The chunks of the positions `found`, read by slot; None if the slots were renumbered
        since the retriever was built (another process compacted the store). A chunk removed since
        is left out."""
        slots = [int(self._slots[pos]) for pos, _ in found]
        by_slot: dict[int, Chunk] = {}
        with self._flock("swap.lock", fcntl.LOCK_SH):
            if int(self._meta("compacted") or 0) > int(self._built_generation or 0):
                return None
            for start in range(0, len(slots), 500):
                part = slots[start : start + 500]
                by_slot.update((r, Chunk(*c)) for r, *c in self._db.execute(
                    f"SELECT row, id, source, position, heading, text FROM chunks WHERE row IN ({','.join('?' * len(part))})",
                    part))
        return [Hit(pos, score, c.id, c.source, c.heading, c.text)
                for (pos, score), s in zip(found, slots, strict=True) if (c := by_slot.get(s)) is not None]


class _Vectors(NamedTuple):
    """One vector per chunk, plus window vectors and the chunk row each belongs to."""

    vectors: np.ndarray
    windows: np.ndarray
    owner: np.ndarray


def _embed(dense: DenseRetriever, texts: list[str], offset: int = 0, progress: Progress | None = None,
           cache: _EmbedCache | None = None, batch: int = 64) -> _Vectors:
    """Embed `texts` and their windows (dense.embed_passages); window owners are numbered from `offset`.

    Texts go to the embedder `batch` at a time (with their windows), each batch through `cache`
    when given (a stopped run resumes from its last batch); progress(done, total) counts texts."""
    embedder: Embedder = dense.embedder if cache is None else cache.over(dense.embedder)
    return _Vectors(*embed_in_batches(embedder, texts, dense.window, dense.stride, batch=batch, offset=offset,
                                      progress=progress))


class _EmbedCache:
    """Embeddings checkpointed in the index database, keyed by embedder and text; committed per
    batch, cleared when a change is stored."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def over(self, embedder: Embedder) -> _CachedEmbedder:
        """`embedder` answering from (and writing to) this cache."""
        return _CachedEmbedder(self, embedder)

    def embed(self, embedder: Embedder, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(f"{embedder.name}\0{t}".encode()).digest()[:16] for t in texts]
        found = self._found(keys)
        out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
        missing: list[int] = []
        for i, key in enumerate(keys):
            vec = found.get(key)
            if vec is not None and len(vec) == embedder.dim * 4:
                out[i] = np.frombuffer(vec, dtype=np.float32)
            else:
                missing.append(i)
        if missing:
            new = np.asarray(embedder.embed([texts[i] for i in missing]), dtype=np.float32)
            out[missing] = new
            self._store([(keys[i], new[j].tobytes()) for j, i in enumerate(missing)])
        return out

    def embed_with_windows(self, embedder: Any, texts: list[str], window: int, stride: int,
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """embedder.embed_with_windows through the cache: per text one entry, its vector then its windows'."""
        dim = embedder.dim
        keys = [hashlib.sha256(f"{embedder.name}\0pass:{window}:{stride}\0{t}".encode()).digest()[:16] for t in texts]
        found = self._found(keys)
        out = np.zeros((len(texts), dim), dtype=np.float32)
        parts: list[np.ndarray] = [np.zeros((0, dim), dtype=np.float32)] * len(texts)
        missing: list[int] = []
        for i, key in enumerate(keys):
            vec = found.get(key)
            if vec is not None and len(vec) and len(vec) % (dim * 4) == 0:
                rows = np.frombuffer(vec, dtype=np.float32).reshape(-1, dim)
                out[i], parts[i] = rows[0], rows[1:]
            else:
                missing.append(i)
        if missing:
            vectors, windows, owner = embedder.embed_with_windows([texts[i] for i in missing], window, stride)
            ptr = np.searchsorted(owner, np.arange(len(missing) + 1))
            for j, i in enumerate(missing):
                out[i], parts[i] = vectors[j], np.asarray(windows[ptr[j] : ptr[j + 1]], dtype=np.float32)
            self._store([(keys[i], np.vstack([out[i][None], parts[i]]).tobytes()) for i in missing])
        lens = [len(x) for x in parts]
        return out, np.vstack(parts) if parts else np.zeros((0, dim), dtype=np.float32), \
            np.repeat(np.arange(len(texts), dtype=np.int64), lens)

    def _found(self, keys: list[bytes]) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            found.update(self.db.execute(f"SELECT key, vec FROM embed_cache WHERE key IN ({','.join('?' * len(part))})",
                                         part).fetchall())
        return found

    def _store(self, rows: list[tuple[bytes, bytes]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO embed_cache(key, vec) VALUES (?, ?)", rows)


class _CachedEmbedder:
    """An embedder whose `embed` goes through an `_EmbedCache` (same name, size and word pieces)."""

    def __init__(self, cache: _EmbedCache, embedder: Embedder) -> None:
        self.cache, self.inner = cache, embedder
        self.name, self.dim = embedder.name, embedder.dim
        # contextual windows (dense.contextual) exactly when the inner embedder has them
        self.embed_with_windows: Callable[[Sequence[str], int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = (
            (lambda texts, window, stride: cache.embed_with_windows(embedder, list(texts), window, stride))
            if contextual(embedder) else None)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.cache.embed(self.inner, list(texts))

    def piece_offsets(self, text: str) -> list[tuple[int, int]]:
        return piece_offsets(self.inner, text)


def _select(v: _Vectors, rows: np.ndarray) -> _Vectors:
    """The vectors of chunk `rows` (in that order) with their windows, owners renumbered 0..len-1."""
    dim = v.vectors.shape[1]
    vectors = np.asarray(v.vectors[rows], dtype=np.float32).reshape(len(rows), dim)
    if not len(v.owner) or not len(rows):
        return _Vectors(vectors, np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=np.int64))
    ptr = np.searchsorted(v.owner, np.arange(len(v.vectors) + 1))
    lens = ptr[rows + 1] - ptr[rows]
    starts = np.repeat(ptr[rows] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    take = starts + np.arange(int(lens.sum()))  # every window of each row, rows in the order given
    return _Vectors(vectors, np.asarray(v.windows[take], dtype=np.float32).reshape(len(take), dim),
                    np.repeat(np.arange(len(rows), dtype=np.int64), lens))


def retriever_parts(retriever: Retriever) -> Iterable[Retriever]:
    """The retrievers a fused retriever combines (itself when it is not fused)."""
    if hasattr(retriever, "parts"):
        parts: Iterable[Retriever] = retriever.parts  # pyright: ignore[reportAttributeAccessIssue]
        return parts
    if hasattr(retriever, "lexical"):
        return [retriever.lexical, retriever.dense]  # type: ignore[attr-defined]
    return [retriever]


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
