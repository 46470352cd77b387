"""A persistent passage store: SQLite for sources and chunks, a .npy file for vectors.

Layout of an index directory:
  index.sqlite   sources (path, content hash), chunks (id, source, position, heading, text, row)
  vectors.npy    float32 [rows, dim], row i = the chunk with row = i; memory-mapped on open
  windows.npy    float32 [windows, dim], overlapping windows of chunks longer than the window
                 (dense scores a chunk by the max over its vector and its windows); memory-mapped
  window_owner.npy  int64 [windows], the chunk row each window belongs to (ascending)
  neighbours.npz the neighbour graph `best` smooths over, with the generation it is of; carried to
                 the next generation by each change (tether.rag._neighbours)
  ann-GEN.hnsw   the HNSW index of generation GEN, only for stores above the ANN threshold

Ingest is incremental: a source whose content hash is unchanged is skipped, a changed one has
its chunks replaced, and a file gone from an ingested folder has its chunks deleted. Only new
chunks are embedded; vectors and windows are compacted (rewritten without deleted rows) after
each change. Stored vectors are used only for the same store generation, embedder and window
scheme; otherwise everything is re-embedded once.

A change is committed twice: first the rows (a new generation, searchable by its words at once),
then, once embedded, its vectors. A search in between, from another process, is answered by the
lexical part of the retriever and says so (`answered_by`, `vectors_pending`); an ingest stopped in
between leaves rows without vectors, which the next ingest or search computes.

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

from tether._errors import InvalidInput, MissingFile
from tether.rag._base import Hit, Retriever
from tether.rag._chunking import Chunk, chunk_sections
from tether.rag._dense import ANN_THRESHOLD, DenseRetriever, count_windows, embed_in_batches, piece_offsets
from tether.rag._encoder import Embedder
from tether.rag._loaders import SUPPORTED, Section, load_file, read_regular, refuse_special
from tether.rag._neighbours import Neighbours
from tether.rag._settings import BEST

# Called as progress(done, total) while passages are embedded (done counts passages).
Progress = Callable[[int, int], None]
# Called with a line for the user (another process holds the index, say).
Notify = Callable[[str], None]

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
        self._rows: list[Chunk] = []
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
        return sqlite3.connect(self.path / "index.sqlite", check_same_thread=False, timeout=60)

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
        """Every chunk, in vector-row order."""
        with self._lock:
            rows = self._db.execute("SELECT id, source, position, heading, text FROM chunks ORDER BY row")
            return [Chunk(*r) for r in rows]

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
        their words from then on), then embed what has no vector yet and store all vectors in a
        second commit. `hashes` holds the content hash of every added or updated source."""
        if not gone and not hashes:
            if self.uses_vectors:
                self._complete_vectors()  # a stopped ingest's passages may still wait for vectors
            return
        gone_set = set(gone)
        # Per-source bookkeeping costs the change, not the store: the rows of the gone sources are
        # read by source (indexed), the kept rows are only renumbered, never read, for a lexical index.
        gone_rows = sorted((r, cid) for src in gone_set
                           for r, cid in self._db.execute("SELECT row, id FROM chunks WHERE source = ?", (src,)))
        dropped = [r for r, _ in gone_rows]
        report.chunks_removed += len(dropped)
        report.chunks_added += len(new)
        plan: tuple[_Vectors | None, list[str]] | None = None
        old_n = len(self)
        if self.uses_vectors:  # read the old vectors before the rows they belong to change
            plan, new = self._plan_vectors(old_n, dropped, new)
        kept = old_n - len(dropped)
        per_source = Counter(c.source for c in new)
        gen = str(int(self._meta("generation") or 0) + 1)
        with self._flock("swap.lock", fcntl.LOCK_EX), self._db:
            self._store_settings()
            for src in gone_set:
                self._db.execute("DELETE FROM chunks WHERE source = ?", (src,))
                self._db.execute("DELETE FROM sources WHERE path = ?", (src,))
            self._close_gaps(dropped)
            self._db.executemany(
                "INSERT OR REPLACE INTO chunks(id, source, position, heading, text, row) VALUES (?, ?, ?, ?, ?, ?)",
                [(c.id, c.source, c.position, c.heading, c.text, kept + i) for i, c in enumerate(new)],
            )
            self._db.executemany("INSERT OR REPLACE INTO sources(path, hash, chunks) VALUES (?, ?, ?)",
                                 [(src, digest, per_source[src]) for src, digest in hashes.items()])
            self._rows_written([cid for _, cid in gone_rows], new)
            self._set_meta("generation", gen)
        self._update_lexical(dropped, new, gen)
        self._retriever = None
        if plan is None:
            return
        reused, fresh = plan
        if self.notify is not None and fresh:
            windows = count_windows(self.embedder, fresh, self.window, self.stride)
            self.notify(f"{len(hashes) or 'no'} documents changed: {len(fresh)} passages and {windows} windows to "
                        f"embed; searches answer from their words meanwhile")
        more = _embed(self._dense(), fresh, offset=len(reused.vectors) if reused else 0,
                      progress=self._progress(), cache=self._cache())
        final = more if reused is None else _Vectors(*(np.concatenate(x) for x in zip(reused, more, strict=True)))
        self._store_vectors(final, gen)
        if reused is not None:  # the neighbour state follows the vectors, by the change alone
            self._update_neighbours(dropped, kept + len(dropped), final.vectors, gen)
        self._retriever = None

    def _rows_written(self, gone: list[str], new: list[Chunk]) -> None:
        """Called in the transaction that stores a change's rows, after they are written (`gone`: the
        ids of the chunks it deleted); a backend that keeps more per row (PostgreSQL's terms) does
        the same to it here."""

    def _update_lexical(self, dropped: list[int], new: list[Chunk], gen: str) -> None:
        """Carry a stored lexical state (BM25's) from the last generation to `gen`: the rows `dropped`
        out, the `new` chunks tokenized and in, weights recomputed (vectorised, no re-tokenizing of
        the store). Without a state for the last generation the next search fits one."""
        from tether.rag._evaluate import make_retriever

        prev = str(int(gen) - 1)
        for part in retriever_parts(make_retriever(self.retriever_name)):
            if not hasattr(part, "update"):
                continue
            name = f"lexical-{part.name}.npz"
            if self._meta(name) != f"{prev}:{part.key()}" or (f := self._file(name)) is None:  # type: ignore[attr-defined]
                continue
            with np.load(f, allow_pickle=False) as stored:
                part.restore(dict(stored))  # type: ignore[attr-defined]
            part.update(dropped, [c.indexed_text for c in new])  # pyright: ignore[reportAttributeAccessIssue]
            tmp = self.path / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp.npz"
            np.savez(tmp, **part.arrays())  # type: ignore[attr-defined]
            try:
                with self._flock("swap.lock", fcntl.LOCK_EX):
                    self._put_file(name, tmp)
                    with self._db:
                        self._set_meta(name, f"{gen}:{part.key()}")  # type: ignore[attr-defined]
            finally:
                tmp.unlink(missing_ok=True)

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

    # -- vectors --------------------------------------------------------------------------------

    def _plan_vectors(self, old_n: int, dropped: list[int],
                      new: list[Chunk]) -> tuple[tuple[_Vectors | None, list[str]], list[Chunk]]:
        """((vectors reused for the first rows, texts to embed for the rest), `new` in row order).
        Kept rows, and new chunks whose text a dropped row had (a changed file's untouched
        passages), reuse their vectors; with nothing usable on disk every row is embedded. Reads
        the dropped rows' texts only: the cost is the change's."""
        old = self._load_vectors(old_n)
        if old is None:
            gone = set(dropped)
            kept = [c for i, c in enumerate(self.chunks()) if i not in gone]
            return (None, [c.indexed_text for c in kept + new]), new
        row_of_text: dict[str, int] = {}
        for start in range(0, len(dropped), 500):
            part = dropped[start : start + 500]
            for row, *c in self._db.execute(
                    f"SELECT row, id, source, position, heading, text FROM chunks WHERE row IN ({','.join('?' * len(part))})",
                    part).fetchall():
                row_of_text[Chunk(*c).indexed_text] = row
        take = np.delete(np.arange(old_n, dtype=np.int64), np.asarray(dropped, dtype=np.int64))
        reused = [c for c in new if c.indexed_text in row_of_text]
        fresh = [c for c in new if c.indexed_text not in row_of_text]
        take = np.concatenate([take, np.asarray([row_of_text[c.indexed_text] for c in reused], dtype=np.int64)])
        return (_select(old, take), [c.indexed_text for c in fresh]), reused + fresh

    def _complete_vectors(self) -> None:
        """Embed and store the vectors of the current rows if they have none (an ingest stopped
        between its two commits, another embedder or window scheme). The caller holds write.lock."""
        rows, gen, stored = self._snapshot()
        if stored is not None:
            return
        self._store_vectors(_embed(self._dense(), [c.indexed_text for c in rows], progress=self._progress(),
                                   cache=self._cache()), gen)

    def _store_vectors(self, vectors: _Vectors, generation: str) -> None:
        """Swap in the vectors of `generation`; the embedding checkpoints have served."""
        with self._flock("swap.lock", fcntl.LOCK_EX), self._db:
            self._save_vectors(vectors, generation)
            self._db.execute("DELETE FROM embed_cache")

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

    def _load_vectors(self, expected_rows: int) -> _Vectors | None:
        """The stored vectors and windows (memory-mapped), or None when missing or stale: wrong
        count, another embedder or window scheme, or saved before a change made while the index
        was open with a retriever that keeps no vectors."""
        if self._meta("embedder") != self.embedder.name:
            return None
        if self._meta("vectors_generation") != (self._meta("generation") or "0"):
            return None
        if self._meta("vectors_windows") != self._dense().windows_key:
            return None
        found = [self._file(f) for f in ("vectors.npy", "windows.npy", "window_owner.npy")]
        if None in found:
            return None
        files = [f for f in found if f is not None]
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
            self._put_file(f"{name}.npy", tmp)
        self._set_meta("embedder", self.embedder.name)
        self._set_meta("vectors", str(len(v.vectors)))
        self._set_meta("vectors_windows", self._dense().windows_key)
        self._set_meta("vectors_generation", generation or self._meta("generation") or "0")
        self._db.execute("DELETE FROM meta WHERE key = 'vectors_progress'")

    # -- search ---------------------------------------------------------------------------------

    def _cache(self) -> _EmbedCache:
        return _EmbedCache(self._db)

    def _snapshot(self) -> tuple[list[Chunk], str, _Vectors | None]:
        """The rows, their generation and (for a dense retriever) their stored vectors, read under
        the shared swap lock: all of one generation."""
        with self._flock("swap.lock", fcntl.LOCK_SH):
            rows = self.chunks()
            gen = self._meta("generation") or "0"
            return rows, gen, self._load_vectors(len(rows)) if self.uses_vectors else None

    def _build(self) -> Retriever:
        from tether.rag._evaluate import make_retriever

        rows, gen, stored = self._snapshot()
        if self.uses_vectors and stored is None:  # missing or stale
            if self._writer_active():  # an ingest is computing them: answer from the words meanwhile
                return self._lexical_meanwhile(rows, gen)
            with self._writing():  # else compute them once, and keep them
                self._complete_vectors()
                rows, gen, stored = self._snapshot()
            assert stored is not None
        self._rows, self._built_generation = rows, gen
        self.answered_by, self.vectors_pending = self.retriever_name, None
        texts = [c.indexed_text for c in rows]
        retriever = make_retriever(self.retriever_name)
        if not self.uses_vectors:
            self._fit_lexical(retriever, texts)
            return retriever
        assert stored is not None
        state = self._neighbours(stored.vectors, self._graph_k(retriever))
        for part in retriever_parts(retriever):
            if isinstance(part, DenseRetriever):
                part._embedder = self.embedder
                part.ann_threshold = self.ann_threshold
                part.window, part.stride = self.window, self.stride
                part.set_vectors(stored.vectors, state.ann if state else None, windows=stored.windows,
                                 owner=stored.owner)
            else:
                self._fit_lexical(part, texts)
        if hasattr(retriever, "prepare"):
            graph = state.rows if state is not None and state.k else None
            retriever.prepare(graph if len(rows) >= getattr(retriever, "min_store", 0) else None)  # pyright: ignore[reportAttributeAccessIssue]
        return retriever

    def _lexical_meanwhile(self, rows: list[Chunk], gen: str) -> Retriever:
        """The lexical part of this index's retriever (BM25 for `dense`), for a store whose vectors
        another process is still computing; `vectors_pending` says how far it is."""
        from tether.rag._evaluate import make_retriever

        lexical = next((p for p in retriever_parts(make_retriever(self.retriever_name))
                        if not isinstance(p, DenseRetriever)), None) or make_retriever("bm25")
        self._rows, self._built_generation = rows, gen
        self._fit_lexical(lexical, [c.indexed_text for c in rows])
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

    def _fit_lexical(self, part: Retriever, texts: list[str]) -> None:
        """Fit a lexical retriever, or take its state as stored for this generation (tokenizing and
        stemming a large store takes seconds; every process searching it did that again)."""
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

    def _neighbours_key(self, generation: str, rows: int, k: int) -> str:
        """What a stored neighbour state is valid for: the generation, the embedder, `k`, and
        whether it has an HNSW index (the store is above the ANN threshold)."""
        return f"{generation}:{self.embedder.name}:{k}:{'ann' if rows > self.ann_threshold else 'exact'}"

    def _load_neighbours(self, key: str, dim: int) -> Neighbours | None:
        """The stored neighbour state if it was saved for `key` (its file names its own key, so a
        state replaced halfway by a stopped writer is never taken for another generation's)."""
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
            return Neighbours.load(f, ann_file, dim)

    def _neighbours(self, vectors: np.ndarray, k: int) -> Neighbours | None:
        """The neighbour state of the current generation: loaded, else built and saved."""
        n = len(vectors)
        if not k and n <= self.ann_threshold:
            return None
        key = self._neighbours_key(self._built_generation or "0", n, k)
        state = self._load_neighbours(key, vectors.shape[1])
        if state is not None and len(state.rows) == n:
            return state
        state = Neighbours.build(np.asarray(vectors), k, n > self.ann_threshold)
        self._save_neighbours(state, key, self._built_generation or "0")
        return state

    def _save_neighbours(self, state: Neighbours, key: str, generation: str) -> None:
        """Store `state` for `generation` if the store is still at it: the HNSW file under a name of
        its generation first, then neighbours.npz (the switch), then older HNSW files removed."""
        ann_name = f"ann-{generation}.hnsw" if state.ann is not None else ""
        stem = self.path / f"neighbours.{os.getpid()}.{threading.get_ident()}"
        tmp_npz, tmp_ann = stem.with_suffix(".npz.tmp"), stem.with_suffix(".hnsw.tmp")
        try:
            state.save(tmp_npz, key, ann_name)
            if state.ann is not None:
                state.ann.save(tmp_ann)
            with self._flock("swap.lock", fcntl.LOCK_EX):
                if (self._meta("generation") or "0") != generation:
                    return  # another process changed the store meanwhile: its readers build their own
                if state.ann is not None:
                    self._put_file(ann_name, tmp_ann)
                self._put_file("neighbours.npz", tmp_npz)
                self._drop_files("ann-", keep=ann_name)
        finally:
            tmp_npz.unlink(missing_ok=True)
            tmp_ann.unlink(missing_ok=True)

    def _update_neighbours(self, dropped: list[int], old_n: int, vectors: np.ndarray, generation: str) -> None:
        """Carry the neighbour state of the last generation to `generation` (rows `dropped`, the
        new rows' vectors at the end of `vectors`), if there is one for the same settings; a change
        of more than half the store is left to the next search's full build."""
        from tether.rag._evaluate import make_retriever

        k = self._graph_k(make_retriever(self.retriever_name))
        n = len(vectors)
        if not k and n <= self.ann_threshold:
            return
        prev = self._load_neighbours(self._neighbours_key(str(int(generation) - 1), old_n, k), vectors.shape[1])
        if prev is None or len(prev.rows) != old_n or (prev.ann is not None) != (n > self.ann_threshold):
            return
        if prev.k < min(k, n - 1):  # built when the store had fewer than k + 1 rows: build it whole
            return
        if 2 * (n - old_n + 2 * len(dropped)) > old_n:  # new rows plus dropped ones (counted twice: both ends)
            return
        prev.update(np.asarray(vectors), np.asarray(dropped, dtype=np.int64))
        self._save_neighbours(prev, self._neighbours_key(generation, n, k), generation)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The `k` best passages for `query`, with chunk id, source, heading, text and score.

        `answered_by` then names the retriever that ranked them; `vectors_pending` is a note when
        that was not the index's own (its vectors are still being computed), else None."""
        if not query.strip():
            raise InvalidInput("query must not be empty")
        with self._lock:
            stale = self._retriever is None or (self._meta("generation") or "0") != self._built_generation
            if not stale and self.vectors_pending:  # the vectors are done, or their writer is gone
                stale = self._meta("vectors_generation") == self._built_generation or not self._writer_active()
            retriever = self._retriever = self._build() if stale or self._retriever is None else self._retriever
            if not self._rows:
                return []
            return [
                Hit(pos, score, c.id, c.source, c.heading, c.text)
                for pos, score in retriever.search(query, k)
                for c in (self._rows[pos],)
            ]


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
        found: dict[bytes, bytes] = {}
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            found.update(self.db.execute(f"SELECT key, vec FROM embed_cache WHERE key IN ({','.join('?' * len(part))})",
                                         part).fetchall())
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
            with self.db:
                self.db.executemany("INSERT OR REPLACE INTO embed_cache(key, vec) VALUES (?, ?)",
                                    [(keys[i], new[j].tobytes()) for j, i in enumerate(missing)])
        return out


class _CachedEmbedder:
    """An embedder whose `embed` goes through an `_EmbedCache` (same name, size and word pieces)."""

    def __init__(self, cache: _EmbedCache, embedder: Embedder) -> None:
        self.cache, self.inner = cache, embedder
        self.name, self.dim = embedder.name, embedder.dim

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
