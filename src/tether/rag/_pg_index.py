"""An index kept in PostgreSQL, shared by processes on any number of machines.

`Index.open("postgresql://user@host:5432/db#support")` (or `tether ingest --index` with that URL)
keeps the index `support` (default: `default`) in the schema `tether_index_support`: the same
tables as the SQLite index (sources, chunks with their text, meta, the embedding checkpoints), the
passages' stemmed terms as rows (`postings`, `doclen`: BM25 is computed by the server, see
tether.rag._pg_lexical) and the remaining arrays (vectors, windows, the neighbour state) in a
`files` table. It is the SQLite `Index` with four things swapped: the connection, the locks
(PostgreSQL advisory locks, exclusive for writers and shared for readers, as the flock files are),
where arrays live, and BM25 (on the server). It ranks as a SQLite index of the same documents. Each
process reads the arrays of the current generation once and searches the vectors in memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tether._errors import InvalidInput, MissingDependency
from tether.rag import _pg_lexical
from tether.rag._base import Retriever
from tether.rag._chunking import Chunk
from tether.rag._index import _SCHEMA, BACKENDS, Index, _like_prefix
from tether.rag._lexical import BM25Retriever

_NAME = re.compile(r"[a-z0-9_]{1,40}")
# SQLite's `INSERT OR REPLACE` as PostgreSQL upserts: the conflict key of each table.
_KEYS = {"meta": "key", "sources": "path", "chunks": "id", "embed_cache": "key", "files": "name"}
_UPSERT = re.compile(r"INSERT OR REPLACE INTO (\w+)\(([^)]*)\)")


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
        with self.conn.cursor() as cur:
            cur.executemany(_pg_sql(sql), rows)

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
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self._schema)))
            db.executescript(_SCHEMA)
            db.executescript(_pg_lexical.SCHEMA)
            db.execute("CREATE TABLE IF NOT EXISTS files (name TEXT PRIMARY KEY, data BYTEA NOT NULL)")
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
        return db

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

    # -- BM25 on the server (tether.rag._pg_lexical) ------------------------------------------------

    def _rows_written(self, gone: list[str], new: list[Chunk]) -> None:
        if self._meta("postings") == "1":
            _pg_lexical.delete_postings(self._db.conn, gone)
            _pg_lexical.write_postings(self._db.conn, new)
            return
        # an index written before the server kept terms (or an empty one): all of its rows, once
        self._db.execute("DELETE FROM postings")
        self._db.execute("DELETE FROM doclen")
        _pg_lexical.write_postings(self._db.conn, self.chunks())
        self._set_meta("postings", "1")

    def _update_lexical(self, dropped: list[int], new: list[Chunk], gen: str) -> None:
        """Nothing to carry: BM25's terms were written with the rows (`_rows_written`)."""

    def _fit_lexical(self, part: Retriever, texts: list[str]) -> None:
        if not isinstance(part, BM25Retriever) or not part.stem:
            super()._fit_lexical(part, texts)
            return
        if self._meta("postings") != "1":
            with self._writing(), self._flock("swap.lock", fcntl.LOCK_EX), self._db:
                if self._meta("postings") != "1":
                    self._rows_written([], [])
        part.remote = _pg_lexical.ServerBM25(self._db.conn, part, [c.id for c in self._rows]).scores

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
