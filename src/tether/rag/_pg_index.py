"""An index kept in PostgreSQL, shared by processes on any number of machines.

`Index.open("postgresql://user@host:5432/db#support")` (or `tether ingest --index` with that URL)
keeps the index `support` (default: `default`) in the schema `tether_index_support`: the same
tables as the SQLite index (sources, chunks with their text, meta, the embedding checkpoints), the
passages' stemmed terms as rows (`postings`, `docterms`, `termdf`: BM25 is computed by the server, see
tether.rag._pg_lexical), and each passage's vector, windows and neighbours as rows
(`chunk_vectors`, `chunk_graph`: tether.rag._pg_rows). It is the SQLite `Index` with five things
swapped: the connection, the locks (PostgreSQL advisory locks, exclusive for writers and shared for
readers, as the flock files are), where vectors and the neighbour graph live (rows, a change writing
only its own), a process's copy of them (read once, then only the rows it has not seen), and BM25
(on the server, one statement per search). It ranks as a SQLite index of the same documents. The
HNSW graph of a store above the ANN threshold is a file (a `files` row) written now and then, with
a change log in between (`ann_log` rows: tether.rag._pg_ann). On a server with pgvector (detected at
open) the vectors are also `vector` rows and the dense scores are computed by the server
(tether.rag._pgvector): a process that only searches reads no vectors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tether._errors import InvalidInput, MissingDependency, OperationFailed
from tether.rag import _pg_ann, _pg_lexical, _pg_rows, _pgvector
from tether.rag._base import Hit, Retriever
from tether.rag._chunking import Chunk
from tether.rag._dense import DenseRetriever
from tether.rag._index import _SCHEMA, BACKENDS, Index, _like_prefix, _Vectors, retriever_parts
from tether.rag._lexical import BM25Retriever
from tether.rag._neighbours import HNSW, Neighbours

_NAME = re.compile(r"[a-z0-9_]{1,40}")
# SQLite's `INSERT OR REPLACE` as PostgreSQL upserts: the conflict key of each table.
_KEYS = {"meta": "key", "sources": "path", "chunks": "id", "embed_cache": "key", "files": "name"}
_UPSERT = re.compile(r"INSERT OR REPLACE INTO (\w+)\(([^)]*)\)")
_VALUES = re.compile(r"VALUES (\([?, ]+\))")


def split_url(url: str) -> tuple[str, str]:
    """(the connection URL, the index name) of `postgresql://...#name`."""
    base, _, name = url.partition("#")
    name = name or "default"
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"index name {name!r} in {url.split('@')[-1]}: use 1-40 of a-z, 0-9 and _")
    return base, name


def _pg_sql(sql: str) -> str:
    """The index's SQLite statements in PostgreSQL's dialect."""
    m = _UPSERT.search(sql)
    if m:
        table, cols = m.group(1), [c.strip() for c in m.group(2).split(",")]
        key = _KEYS[table]
        sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols if c != key)
        sql = sql.replace("INSERT OR REPLACE INTO", "INSERT INTO", 1) + f" ON CONFLICT ({key}) DO UPDATE SET {sets}"
    return sql.replace("BLOB", "BYTEA").replace("?", "%s")


class _Connection:
    """A psycopg connection with the parts of sqlite3's interface the index uses: `execute`,
    `executemany`, `executescript`, and `with conn:` as one transaction."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._depth = 0

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(_pg_sql(sql), params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One INSERT of many rows per statement (a round trip per row made a first ingest slow)."""
        rows = list(rows)
        values = _VALUES.search(sql)
        if values is None or len(rows) < 2:
            with self.conn.cursor() as cur:
                cur.executemany(_pg_sql(sql), rows)
            return
        if (m := _UPSERT.search(sql)) is not None:  # a row upserted twice in one statement is an error
            key = [c.strip() for c in m.group(2).split(",")].index(_KEYS[m.group(1)])
            rows = list({row[key]: row for row in rows}.values())  # the last one wins, as one by one
        per = max(1, 30_000 // len(rows[0]))  # PostgreSQL takes at most 65,535 parameters
        for start in range(0, len(rows), per):
            part = rows[start : start + per]
            many = sql[: values.start(1)] + ", ".join([values.group(1)] * len(part)) + sql[values.end(1) :]
            self.conn.execute(_pg_sql(many), [x for row in part for x in row])

    def executescript(self, script: str) -> None:
        for statement in script.split(";"):
            if statement.strip():
                self.conn.execute(_pg_sql(statement))

    def __enter__(self) -> _Connection:
        self._depth += 1
        if self._depth == 1:
            self.conn.execute("BEGIN")
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.conn.execute("ROLLBACK" if exc_type else "COMMIT")

    def close(self) -> None:
        self.conn.close()


class PostgresIndex(Index):
    """An `Index` whose store is a PostgreSQL schema (see the module docstring)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._url, self.name = split_url(url)
        self._schema = f"tether_index_{self.name}"
        self._local: dict[str, Path] = {}
        # arrays read from the database, and files written before they are stored, live here
        super().__init__(tempfile.mkdtemp(prefix="tether-pg-index-"), **kwargs)
        self.location = f"{self._url.rpartition('@')[2]}#{self.name}"  # no password in messages

    @classmethod
    def at_url(cls, url: str, **kwargs: Any) -> Index:
        return cls(url, **kwargs)

    @classmethod
    def exists_at(cls, url: str) -> bool:
        import psycopg

        base, name = split_url(url)
        with psycopg.connect(base, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND "
                                "table_name = 'chunks'", (f"tether_index_{name}",)).fetchone() is not None

    def _connect(self) -> Any:
        try:
            import psycopg
        except ImportError as exc:  # the [postgres] extra
            raise MissingDependency("an index in PostgreSQL needs psycopg: pip install 'tether[postgres]'") from exc
        from psycopg import sql

        conn = psycopg.connect(self._url, autocommit=True)
        self._made_dir = False
        db = _Connection(conn)
        # CREATE ... IF NOT EXISTS is not safe against a concurrent CREATE: one process at a time
        key = self._lock_key("schema")
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        try:
            self._made_db = conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                                         (self._schema,)).fetchone() is None
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema)))
            self.pgvector = _pgvector.probe(conn)
            path = [self._schema] + ([self.pgvector.schema] if self.pgvector.schema else [])
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.SQL(", ").join(map(sql.Identifier, path))))
            db.executescript(_SCHEMA)
            db.executescript(_pg_lexical.SCHEMA)
            db.executescript(_pg_rows.SCHEMA)
            db.executescript(_pg_ann.SCHEMA)
            db.execute("CREATE TABLE IF NOT EXISTS files (name TEXT PRIMARY KEY, data BYTEA NOT NULL)")
            # what names this schema's rows in a process's cache (a schema dropped and made again is another)
            conn.execute("INSERT INTO meta (key, value) VALUES ('instance', %s) ON CONFLICT DO NOTHING",
                         (uuid.uuid4().hex,))
            row = conn.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()
            instance = str(row[0]) if row else ""
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
        self._rowcache = _pg_rows.cache_for(f"{self._url.rpartition('@')[2]}#{self.name}#{instance}")
        self._server: _pg_lexical.ServerBM25 | None = None
        self._graph_from: str | None = None  # the generation whose stored graph was last loaded
        self._held: _pg_ann.Held | None = None  # the HNSW index this object read (or wrote) last
        self._next_order: tuple[str, _pg_rows.Order] | None = None  # a change's chunk order, until committed
        self._gone: list[tuple[str, bool]] = []  # a change's removed ids (and whether gone for good), until committed
        self._dead: tuple[str, dict[int, str]] | None = None  # generation, removed slot -> id, till its vectors are stored
        self._dense_server: _pgvector.ServerDense | None = None
        self._on_server = False  # the built generation's dense scores come from the server (no vectors read)
        return db

    @property
    def dense_path(self) -> str:
        """Where this index's dense search runs, in one line (the ingest's first lines, `tether doctor`)."""
        return self.pgvector.note

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.path, ignore_errors=True)

    def discard(self) -> None:
        super().discard()
        shutil.rmtree(self.path, ignore_errors=True)

    def _remove_created(self) -> None:
        if self._made_db:
            import psycopg
            from psycopg import sql

            with psycopg.connect(self._url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self._schema)))

    def _file(self, name: str) -> Path | None:
        row = self._db.execute("SELECT data FROM files WHERE name = ?", (name,)).fetchone()
        if row is None:
            return None
        fd, path = tempfile.mkstemp(dir=self.path, prefix=name + ".")
        with open(fd, "wb") as fh:  # a new file each time: arrays mapped from the last one stay valid
            fh.write(row[0])
        if (old := self._local.get(name)) is not None:
            old.unlink(missing_ok=True)  # (a mapping outlives its file's name)
        self._local[name] = Path(path)
        return self._local[name]

    def _put_file(self, name: str, written: Path) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO files(name, data) VALUES (?, ?)", (name, written.read_bytes()))
        written.unlink()

    def _reclaim(self) -> None:
        pass  # (PostgreSQL's autovacuum keeps the space of deleted rows for reuse)

    def _metas(self, *keys: str) -> dict[str, str]:
        """Several meta values in one round trip (missing keys are absent)."""
        return dict(self._db.conn.execute("SELECT key, value FROM meta WHERE key = ANY(%s)", (list(keys),)).fetchall())

    # -- rows: chunks, vectors and the neighbour graph through the process's cache (tether.rag._pg_rows)
    #
    # Slots as in SQLite (chunks.row): a change's chunks take new slots at the end, a removed
    # chunk's slot goes dead, a compaction renumbers. Rows are kept by chunk id, so a slot is only a
    # place in the arrays handed to `Index`: `_load_vectors` lays the vector rows of a generation's
    # ids out at their slots, keeping the layout in the process (tether.rag._pg_rows.Laid) and adding
    # only the slots after it that a later generation brings (a change's own, also added by `_joined`
    # as it stores them); a dead slot keeps what it held, as in SQLite's appended files: nothing
    # reads it, except the slots this object's own change just removed, for `_embed_missing` to
    # reuse. The neighbour state is translated between slots and ids the same way. Renumbering
    # changes no row (the layout is made anew).

    def chunks(self) -> list[Chunk]:
        with self._lock:
            gen = self._meta("generation") or "0"
            return self._rowcache.chunk_rows(self._db.conn, self._rowcache.order(self._db.conn, gen).ids)

    @property
    def _rows(self) -> list[Chunk]:
        """The chunks of the built positions, from this process's copy when it has their generation."""
        order = self._rowcache.orders.get(self._built_generation or "0")
        if self._chunk_cache is None and order is not None and np.array_equal(order.slots, self._slots):
            self._chunk_cache = self._rowcache.chunk_rows(self._db.conn, order.ids)
        return super()._rows

    def _live_slots(self) -> np.ndarray:
        return self._rowcache.order(self._db.conn, self._meta("generation") or "0").slots

    def _vec_key(self) -> str:
        return f"{self.embedder.name}:{self._dense().windows_key}"

    def _load_vectors(self, complete: bool = True) -> _Vectors | None:
        """The vectors and windows per slot (read from the cache, the rows it lacks from the
        server), or None when they are another embedder's or (`complete`) a live slot has none yet;
        with `complete=False`, those of the slots before the first live one without a vector row."""
        m = self._metas("embedder", "vectors_windows", "generation", "vectors_generation")
        if m.get("embedder") != self.embedder.name or m.get("vectors_windows") != self._dense().windows_key:
            return None
        gen = m.get("generation", "0")
        if complete and m.get("vectors_generation") != gen:
            return None
        order = self._rowcache.order(self._db.conn, gen)
        extra = self._dead[1] if self._dead is not None and self._dead[0] == gen else {}  # (their rows are kept)
        laid = self._rowcache.lay_out(self._db.conn, order, extra, self._vec_key(), self.embedder.dim)
        if laid is None:  # an index written before vectors were rows keeps them in `files` till its next change
            return super()._load_vectors(complete)
        if complete and len(laid[0]) < order.total:  # (a removed slot without its row too: `_embed_missing` would reuse it)
            return None
        return _Vectors(*laid)

    def _joined(self, have: _Vectors | None, new: _Vectors, generation: str) -> _Vectors:
        """As `Index._joined`, by adding `new` to this process's layout of `have` in place when
        `have` is that (a change then costs its own slots, not the store's)."""
        laid = self._rowcache.laid
        if have is None or laid is None or not np.may_share_memory(have.vectors, laid.vecs):
            return super()._joined(have, new, generation)
        order = self._rowcache.order(self._db.conn, generation)
        start = int(np.searchsorted(order.slots, len(have.vectors)))
        ids = dict(zip(order.slots[start:].tolist(), order.ids[start:], strict=True))
        got = self._rowcache.laid_after(self._vec_key(), self.embedder.dim, len(have.vectors), ids, new.vectors,
                                        new.windows, new.owner)
        return _Vectors(*got) if got is not None else super()._joined(have, new, generation)

    def _write_arrays(self, v: _Vectors) -> list[Path]:
        return []  # the rows are written in `_switch_vectors`, in the transaction that swaps them in

    def _drop_old_arrays(self) -> None:
        pass  # (`_switch_vectors` removes the arrays an index kept before its vectors were rows)

    def _switch_vectors(self, tmps: list[Path], v: _Vectors, generation: str) -> None:
        """Write the vector rows of the chunks that have none (all of them for another embedder or
        window scheme) from `v` (per slot of the rows as they are now), delete those of the chunks
        removed; called in the transaction that swaps the vectors in."""
        conn = self._db.conn
        m = self._metas("embedder", "vectors_windows")
        if m.get("embedder") != self.embedder.name or m.get("vectors_windows") != self._dense().windows_key:
            conn.execute("DELETE FROM chunk_vectors")
            need = conn.execute("SELECT row, id FROM chunks").fetchall()
        else:
            need = conn.execute("SELECT c.row, c.id FROM chunks c WHERE NOT EXISTS "
                                "(SELECT 1 FROM chunk_vectors v WHERE v.id = c.id)").fetchall()
        need = [(int(r), str(c)) for r, c in need if r < len(v.vectors)]
        ptr = np.searchsorted(v.owner, np.arange(len(v.vectors) + 1))
        vectors, windows = np.asarray(v.vectors, dtype=np.float32), np.asarray(v.windows, dtype=np.float32)
        _pg_rows.copy_rows(conn, "chunk_vectors", "id, vec, windows",
                           [(c, vectors[r].tobytes(), windows[ptr[r] : ptr[r + 1]].tobytes()) for r, c in need])
        dead = list(self._dead[1].values()) if self._dead is not None and self._dead[0] == (
            self._meta("generation") or "0") else None  # (None: a stopped change's, a compaction: no list of what went)
        if dead is not None:
            conn.execute("DELETE FROM chunk_vectors WHERE id = ANY(%s)", (dead,))
        else:
            conn.execute("DELETE FROM chunk_vectors v WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.id = v.id)")
        self._dead = None
        if self.pgvector.schema is not None:
            self._switch_server_vectors(v, ptr, dead)
        with self._rowcache.lock:
            laid = self._rowcache.laid
            if len(need) == len(vectors) and (laid is None or not np.may_share_memory(vectors, laid.vecs)):
                ids: list[str | None] = [None] * len(vectors)  # every slot written now: `v` is the layout
                for r, c in need:
                    ids[r] = c
                self._rowcache.adopt(self._vec_key(), ids, vectors, windows, np.asarray(v.owner))
            else:
                self._rowcache.use_key(self._vec_key(), self.embedder.dim)
                for r, c in need:
                    self._rowcache.add_vector(c, vectors[r], windows[ptr[r] : ptr[r + 1]])
        for prefix in ("vectors.", "windows.", "window_owner.", "neighbours.npz"):  # arrays kept before vectors were rows
            self._drop_files(prefix)
        self._db.execute("DELETE FROM meta WHERE key = 'vectors_epoch'")
        self._vector_meta(len(v.vectors), len(v.windows), generation)
        if self.pgvector.schema is not None:
            self._set_meta("pgvector", f"{self._vec_key()}@{generation}")

    def _switch_server_vectors(self, v: _Vectors, ptr: np.ndarray, dead: list[str] | None) -> None:
        """Bring `chunk_vecs` (pgvector) to the vectors `v` per slot, in the transaction that swaps
        them in: the rows of chunks that have none written, those of removed chunks deleted; all of
        them again when they were of another embedder or window scheme or a writer without pgvector
        changed the index since (the meta `pgvector` names the vectors key and generation they are of)."""
        conn = self._db.conn
        key = self._vec_key()
        m = self._metas("pgvector", "vectors_generation")
        was_key, _, was_gen = m.get("pgvector", "").rpartition("@")
        _pgvector.ensure_table(conn, self.embedder.dim)
        if was_key != key:
            conn.execute("DELETE FROM chunk_vecs")
            _pgvector.drop_index(conn)  # (built again in bulk after the rows)
        if was_key != key or was_gen != m.get("vectors_generation", "0"):
            dead = None  # (kept up by another writer meanwhile, or never: find what went by the chunks)
        _pgvector.delete(conn, dead)
        need = conn.execute("SELECT c.row, c.id FROM chunks c WHERE NOT EXISTS "
                            "(SELECT 1 FROM chunk_vecs v WHERE v.id = c.id AND v.part = 0)").fetchall()
        need = [(int(r), str(c)) for r, c in need if r < len(v.vectors)]
        _pgvector.write(conn, [c for _, c in need], np.asarray(v.vectors, dtype=np.float32)[[r for r, _ in need]],
                        [np.asarray(v.windows[ptr[r] : ptr[r + 1]], dtype=np.float32) for r, _ in need])
        _pgvector.index_if_large(conn, len(self._live_slots()))

    def _load_neighbours(self, key: str, vectors: np.ndarray) -> Neighbours | None:
        """The graph stored for `key`, per slot (its generation's chunk order must be known to this
        process: the current one, or the one before that this process read); this object's own if
        it saved or loaded it last. Its HNSW index (above the ANN threshold) is the one this object
        holds with the log rows written since replayed, else the file with its log replayed
        (tether.rag._pg_ann)."""
        if self._graph is not None and self._graph[0] == key:
            return self._graph[1]
        gen = key.split(":", 1)[0]
        conn = self._db.conn
        with self._flock("swap.lock", fcntl.LOCK_SH):
            m = self._metas("neighbours_key", "neighbours_k", "neighbours_ann", "ann_next_label", "ann_log_seq",
                            "generation")
            if m.get("neighbours_key") != key:
                return None
            order = self._rowcache.orders.get(gen)
            if order is None and gen == m.get("generation", "0"):
                order = self._rowcache.order(conn, gen)
            if order is None:
                return None
            self._rowcache.refresh_graph(conn)
            got = self._rowcache.graph_arrays(order.ids, int(m.get("neighbours_k", "0")))
            if got is None:
                return None
            pos_rows, pos_sims, pos_labels = got
            slots = order.slots
            rows = np.repeat(np.arange(order.total, dtype=np.int64)[:, None], pos_rows.shape[1], axis=1)
            sims = np.zeros((order.total, pos_rows.shape[1]), dtype=np.float32)
            labels = np.full(order.total, -1, dtype=np.int64)  # (a dead slot: none)
            rows[slots], sims[slots], labels[slots] = slots[pos_rows], pos_sims, pos_labels
            held = None
            ann_name = m.get("neighbours_ann", "")
            if ann_name:
                upto = int(m.get("ann_log_seq", "0"))
                held = self._held
                if held is None or held.base != ann_name or held.seq > upto:
                    self._held = None
                    if (f := self._file(ann_name)) is None:
                        return None
                    held = _pg_ann.Held(ann_name, 0, HNSW.load(f, labels, 0, vectors.shape[1]), [])
                    f.unlink()  # (read into memory)
                    self._local.pop(ann_name, None)
                held = _pg_ann.replay(conn, held, upto, vectors.shape[1])
                held.ann.relabel(labels, int(m.get("ann_next_label", "0")))
                self._held = held
            self._graph_from = gen
            state = Neighbours(rows, sims, held.ann if held is not None else None)
            state.touched = np.zeros(0, dtype=np.int64)  # (as stored)
            state.base, state.log = ann_name, list(held.log) if held is not None else []
        self._graph = (key, state)
        return state

    def _stored_neighbours_key(self) -> str | None:
        return self._meta("neighbours_key")

    def _save_neighbours(self, state: Neighbours, key: str, generation: str) -> None:
        """Store `state` for `generation` if the store is still at it: the graph rows that differ
        from the last generation's (all of them when it was built whole) and, above the ANN
        threshold, the HNSW changes since the last save as log rows, or the HNSW file whole when
        due (tether.rag._pg_ann)."""
        self._graph, held, self._held = None, self._held, None  # (`state` may be the one held, changed in place)
        tmp_ann = self.path / f"neighbours.{os.getpid()}.{threading.get_ident()}.hnsw.tmp"
        conn = self._db.conn
        rebase = state.ann is not None and state.rebase_due
        try:
            if state.ann is not None and rebase:
                state.ann.save(tmp_ann)
            with self._flock("swap.lock", fcntl.LOCK_EX):
                if (self._meta("generation") or "0") != generation:
                    return  # another process changed the store meanwhile: its readers build their own
                order = self._rowcache.order(conn, generation)
                if order.total != len(state.rows):
                    return
                if state.ann is not None and not rebase and state.base != (self._meta("neighbours_ann") or ""):
                    rebase = True  # another process wrote the file anew since this state's: its log is of that one
                    state.ann.save(tmp_ann)
                prev = self._rowcache.orders.get(str(int(generation) - 1)) if self._graph_from == str(
                    int(generation) - 1) else None
                slots = order.slots
                positions = state.positions(slots)
                labels = state.ann.labels[slots] if state.ann is not None else None
                if prev is not None and state.touched is not None:  # carried: only the rows `update` changed
                    at = np.searchsorted(slots, state.touched)
                    at = at[(at < len(slots)) & (slots[np.minimum(at, len(slots) - 1)] == state.touched)]
                    rows = self._rowcache.graph_rows([order.ids[i] for i in at.tolist()], positions[at],
                                                     state.sims[slots[at]], labels[at] if labels is not None else None,
                                                     names=order.ids)
                else:
                    rows = self._rowcache.graph_rows(order.ids, positions, state.sims[slots], labels)
                with self._db:
                    ann_name, seq = "", 0
                    if state.ann is not None and rebase:
                        name_stamp = int(conn.execute("SELECT nextval('row_stamps')").fetchone()[0])
                        ann_name = f"ann-{generation}-{name_stamp}.hnsw"  # (a name of its own: see `_load_neighbours`)
                        self._put_file(ann_name, tmp_ann)
                        conn.execute("DELETE FROM ann_log")
                    elif state.ann is not None:  # a change: its log rows, not the file
                        ann_name = state.base
                        seq = _pg_ann.write_entries(conn, ann_name, state.ann,
                                                    state.log[_pg_ann.logged(conn, ann_name):]) \
                            or int(self._meta("ann_log_seq") or 0)
                    if prev is None:  # built whole: every row
                        conn.execute("DELETE FROM chunk_graph")
                    else:  # carried: the rows that changed, and those of passages new to it
                        self._rowcache.refresh_graph(conn)
                        was = set(prev.ids)
                        rows = [r for r in rows if r[0] not in was or self._rowcache.graph.get(r[0]) != r[1:]]
                        gone = list(was - set(order.ids))
                        if gone:
                            conn.execute("DELETE FROM chunk_graph WHERE id = ANY(%s)", (gone,))
                    stamp = int(conn.execute("SELECT nextval('row_stamps')").fetchone()[0])
                    if rows and prev is not None:
                        conn.execute("DELETE FROM chunk_graph WHERE id = ANY(%s)", ([r[0] for r in rows],))
                    _pg_rows.copy_rows(conn, "chunk_graph", "id, stamp, nbrs, sims, label",
                                       [(cid, stamp, nbrs, sims, label) for cid, nbrs, sims, label in rows])
                    self._set_meta("neighbours_key", key)
                    self._set_meta("neighbours_k", str(state.k))
                    self._set_meta("neighbours_ann", ann_name)
                    self._set_meta("ann_log_seq", str(seq))
                    self._set_meta("ann_next_label", str(state.ann.next_label if state.ann is not None else 0))
                with self._rowcache.lock:  # committed: this process's copy is the server's
                    if prev is None:
                        self._rowcache.graph = {}
                    for cid, nbrs, sims, label in rows:
                        self._rowcache.graph[cid] = (nbrs, sims, label)
                    self._rowcache.graph_stamp = max(self._rowcache.graph_stamp, stamp)
                self._graph_from = generation
                state.touched = np.zeros(0, dtype=np.int64)  # (as stored now)
                self._drop_files("ann-", keep=ann_name)
                held = None  # (stored: what this object holds now is below)
                if state.ann is None or not rebase:
                    self._graph = (key, state)
                    if state.ann is not None:
                        self._held = _pg_ann.Held(ann_name, seq, state.ann, list(state.log))
                else:  # A written HNSW index is taken back from its file (hnswlib does not store its level
                    # generator: every process continues from the file, this one too)
                    state.base, state.log = ann_name, []
        finally:
            tmp_ann.unlink(missing_ok=True)
            if held is not None and state.ann is not held.ann:
                self._held = held  # not stored, nor changed by this save: still what this object holds

    # -- BM25 on the server (tether.rag._pg_lexical) ------------------------------------------------

    def _rows_written(self, gone: list[str], new: list[Chunk]) -> None:
        conn = self._db.conn
        start = self._slot_count()  # (this change's slots are counted after this hook)
        old_gen = self._meta("generation") or "0"
        old = self._rowcache.orders.get(old_gen)  # the writer knows the new order without reading it back
        gone_set = set(gone)
        if old is not None and (gone or new):  # (taken once the change is committed: `_update_lexical`)
            keep = [i for i, c in enumerate(old.ids) if c not in gone_set]
            self._next_order = (str(int(old_gen) + 1), _pg_rows.Order(
                [old.ids[i] for i in keep] + [c.id for c in new],
                np.concatenate([old.slots[keep], np.arange(start, start + len(new), dtype=np.int64)]),
                start + len(new)))
        kept_ids = {c.id for c in new}  # a passage deleted and written again keeps its vector
        self._gone = [(cid, cid not in kept_ids) for cid in gone]
        with self._rowcache.lock:
            for c in new:  # an id names its text: safe to keep even if this change is rolled back
                self._rowcache.chunks[c.id] = c
        if self._meta("postings") == _pg_lexical.VERSION:
            _pg_lexical.delete_postings(conn, gone)
            _pg_lexical.write_postings(conn, new)
            return
        # an index written before the server kept these terms (or an empty one): all of its rows, once
        for table in _pg_lexical.TABLES:
            conn.execute(f"DELETE FROM {table}")
        _pg_lexical.write_postings(conn, Index.chunks(self))
        self._set_meta("postings", _pg_lexical.VERSION)

    def _update_lexical(self, dropped: list[int], new: list[Chunk], gen: str) -> None:
        """Nothing to carry: BM25's terms were written with the rows (`_rows_written`). Called once
        the change is committed: the new chunk order goes into this process's copy, and the slots
        `dropped` (in the order of the ids `_rows_written` was given) are remembered with their ids."""
        if self._next_order is not None and self._next_order[0] == gen:
            self._rowcache.remember_order(*self._next_order)
        self._next_order = None
        self._dead = (gen, {s: cid for s, (cid, dead) in zip(dropped, self._gone, strict=True) if dead})
        self._gone = []

    # -- dense search by the server (tether.rag._pgvector) -----------------------------------------

    def _snapshot(self) -> tuple[np.ndarray, str, _Vectors | None]:
        """As `Index._snapshot`; when the server holds this generation's vectors (pgvector) the dense
        retriever gets its scores from the server (`_build`), and below the ANN threshold no vector
        is read: it gets placeholders of width 0 (above it the neighbour graph's HNSW file needs them)."""
        self._on_server = False
        if self.pgvector.schema is None or not self.uses_vectors:
            return super()._snapshot()
        with self._flock("swap.lock", fcntl.LOCK_SH):
            slots = self._live_slots()
            gen = self._meta("generation") or "0"
            m = self._metas("embedder", "vectors_windows", "vectors_generation", "pgvector")
            if (m.get("embedder") != self.embedder.name or m.get("vectors_windows") != self._dense().windows_key
                    or m.get("vectors_generation") != gen or m.get("pgvector") != f"{self._vec_key()}@{gen}"):
                return slots, gen, self._load_vectors()  # (a writer without pgvector changed it: rows till the next change)
            self._on_server = True
            if len(slots) > self.ann_threshold:
                return slots, gen, self._load_vectors()
            total = self._rowcache.order(self._db.conn, gen).total
            return slots, gen, _Vectors(np.zeros((total, 0), dtype=np.float32), np.zeros((0, 0), dtype=np.float32),
                                        np.zeros(0, dtype=np.int64))

    def _neighbours(self, vectors: np.ndarray, k: int, live: np.ndarray) -> Neighbours | None:
        """As `Index._neighbours`; for placeholder vectors (`_snapshot`) the stored graph, else the
        vectors are read after all to build it."""
        if vectors.shape[1] or not k:
            return super()._neighbours(vectors, k, live)
        state = self._load_neighbours(self._neighbours_key(self._built_generation or "0", False, k), vectors)
        if state is not None and len(state.rows) == len(vectors):
            return state
        stored = self._load_vectors()
        if stored is None:
            raise OperationFailed(f"the vectors of {self.location} changed while it was read; search again")
        return super()._neighbours(stored.vectors, k, live)

    def _build(self) -> Retriever:
        self._server = self._dense_server = None
        retriever = super()._build()
        if not self._on_server or self.vectors_pending:
            return retriever
        gen = self._built_generation or "0"
        self._dense_server = _pgvector.ServerDense(self._db.conn, self._rowcache.order(self._db.conn, gen).ids, gen)
        for part in retriever_parts(retriever):
            if isinstance(part, DenseRetriever):
                if part.rocchio is not None:  # (feedback moves the query by the passages' own vectors)
                    raise OperationFailed("Rocchio feedback needs the vectors on the client")
                part.remote, part.remote_top = self._dense_server.scores, self._dense_server.top
        return retriever

    def _fit_lexical(self, part: Retriever, texts: list[str]) -> None:
        if not isinstance(part, BM25Retriever) or not part.stem:
            super()._fit_lexical(part, texts)
            return
        if self._meta("postings") != _pg_lexical.VERSION:
            with self._writing(), self._flock("swap.lock", fcntl.LOCK_EX), self._db:
                if self._meta("postings") != _pg_lexical.VERSION:
                    self._rows_written([], [])
        self._server = _pg_lexical.ServerBM25(self._db.conn, part, [c.id for c in self._rows],
                                              self._built_generation or "0")
        part.remote = self._server.scores

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """As `Index.search`; a search whose BM25 the server computes is one statement, and one more
        for dense scores by pgvector (each says the index's generation: a newer one is read, and the
        search asked again)."""
        if not query.strip():
            raise InvalidInput("query must not be empty")
        with self._lock:
            retriever = self._retriever
            if retriever is None or (self._server is None and self._dense_server is None) or self.vectors_pending:
                try:
                    return super().search(query, k)
                except _pgvector._Stale:  # the vectors moved on between the check and the statement
                    self._retriever = None
                    return super().search(query, k)
            try:
                found = retriever.search(query, k)
            except (_pg_lexical._Stale, _pgvector._Stale):
                self._retriever = None
                return super().search(query, k)
            return [Hit(pos, score, c.id, c.source, c.heading, c.text)
                    for pos, score in found for c in (self._rows[pos],)]

    def _drop_files(self, prefix: str, keep: str = "") -> None:
        with self._db:
            self._db.execute("DELETE FROM files WHERE name LIKE ? ESCAPE '\\' AND name <> ?",
                             (_like_prefix(prefix), keep))

    def _lock_key(self, name: str) -> str:
        return f"tether-index:{self._schema}:{name}"

    @contextlib.contextmanager
    def _flock(self, name: str, mode: int, waiting: str | None = None) -> Iterator[None]:
        shared = "_shared" if mode == fcntl.LOCK_SH else ""
        key = self._lock_key(name)
        if not self._db.execute(f"SELECT pg_try_advisory_lock{shared}(hashtext(?))", (key,)).fetchone()[0]:
            if waiting and self.notify is not None:
                self.notify(waiting)
            self._db.execute(f"SELECT pg_advisory_lock{shared}(hashtext(?))", (key,))
        try:
            yield
        finally:
            self._db.execute(f"SELECT pg_advisory_unlock{shared}(hashtext(?))", (key,))

    def _writer_active(self) -> bool:
        key = self._lock_key("write.lock")
        if self._db.execute("SELECT pg_try_advisory_lock(hashtext(?))", (key,)).fetchone()[0]:
            self._db.execute("SELECT pg_advisory_unlock(hashtext(?))", (key,))
            return False
        return True


BACKENDS["postgresql"] = BACKENDS["postgres"] = PostgresIndex
