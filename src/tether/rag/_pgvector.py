"""Dense search by the server, for a PostgreSQL index whose server has pgvector (tether.rag._pg_index).

At open the index asks the server whether it offers the `vector` extension
(`pg_available_extensions`) and creates it when it may (`CREATE EXTENSION IF NOT EXISTS vector`).
With it, each passage's whole-text vector and its windows' are also rows of `chunk_vecs(id, part,
vec vector(384))` (part 0 the passage's vector, 1.. its windows), written in the transaction that
swaps a change's vectors in. The dense scores of a search are then one statement: the server
computes each passage's best inner product over its rows (MaxP, as DenseRetriever does) for the
query vector the client embedded, and returns them with the generation it saw (a search of an
older one is asked again once the client has read the new one). Below
`EXACT_BELOW` passages a search scans every row (exact: the ranks are SQLite's, up to float32
rounding in another order of summation). From `EXACT_BELOW` passages on the table has an HNSW index
on inner product (built in bulk when the store reaches that size: inserted row by row it made a
first ingest of 1,100 passages 6x slower, and below that size nothing reads it), and a `dense`
search takes its top passages through it; `best` and `hybrid` still score every passage exactly
(their normalisation and rank fusion need every score). Without the extension the vectors stay
rows cached by each process (tether.rag._pg_rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

EXACT_BELOW = 50_000  # passages: below this a dense search scans every vector (as SQLite's index does)
HNSW_EF = 400  # hnsw.ef_search of an approximate search (pgvector's default, 40, misses too many)


@dataclass(frozen=True, slots=True)
class Support:
    """What the server offers: `schema` holds the extension when it is usable, else None; `note`
    says which path the index takes and why, in one line."""

    schema: str | None
    version: str
    note: str


def probe(conn: Any) -> Support:
    """Whether the server offers pgvector to this user (an autocommit psycopg connection, before
    the index's search_path is set): creates the extension when it is available and may be."""
    row = conn.execute("SELECT default_version, installed_version FROM pg_available_extensions "
                       "WHERE name = 'vector'").fetchone()
    if row is None:
        return Support(None, "", "dense search: vectors as rows, cached by each process (the server has no pgvector)")
    if row[1] is None:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except Exception as exc:  # psycopg's InsufficientPrivilege and the like: the rows path stays
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return Support(None, "", f"dense search: vectors as rows, cached by each process (the server has "
                                     f"pgvector {row[0]} but this user cannot create it: {reason}; "
                                     f"CREATE EXTENSION vector by a superuser in this database turns it on)")
    got = conn.execute("SELECT n.nspname, e.extversion FROM pg_extension e JOIN pg_namespace n "
                       "ON n.oid = e.extnamespace WHERE e.extname = 'vector'").fetchone()
    if got is None:  # (dropped meanwhile)
        return Support(None, "", "dense search: vectors as rows, cached by each process (pgvector is gone)")
    return Support(str(got[0]), str(got[1]), f"dense search: on the server (pgvector {got[1]}: exact below "
                                             f"{EXACT_BELOW:,} passages, HNSW from there)")


def schema_sql(dim: int) -> str:
    """The table of the passages' vectors (in the index's schema)."""
    return f"""CREATE TABLE IF NOT EXISTS chunk_vecs (id TEXT NOT NULL, part INTEGER NOT NULL,
    vec vector({dim}) NOT NULL, PRIMARY KEY (id, part))"""


def index_if_large(conn: Any, passages: int) -> None:
    """Build the HNSW index once the store has `EXACT_BELOW` passages (in bulk: see the module
    docstring); an emptied table loses it (`drop_index`) and gets it again here."""
    if passages >= EXACT_BELOW:
        conn.execute("CREATE INDEX IF NOT EXISTS chunk_vecs_hnsw ON chunk_vecs USING hnsw (vec vector_ip_ops)")


def drop_index(conn: Any) -> None:
    conn.execute("DROP INDEX IF EXISTS chunk_vecs_hnsw")


def has_table(conn: Any, dim: int) -> bool:
    """Whether the index's `chunk_vecs` exists with vectors of `dim` (a type modifier of another
    size: another embedder's, made again)."""
    row = conn.execute("SELECT a.atttypmod FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                       "WHERE c.relname = 'chunk_vecs' AND c.relnamespace = current_schema()::regnamespace "
                       "AND a.attname = 'vec'").fetchone()
    return row is not None and int(row[0]) == dim


def ensure_table(conn: Any, dim: int) -> None:
    """`chunk_vecs` for vectors of `dim` (emptied and made again for another size)."""
    if not has_table(conn, dim):
        conn.execute("DROP TABLE IF EXISTS chunk_vecs")
        conn.execute(schema_sql(dim))


def text(vec: np.ndarray) -> str:
    """pgvector's text form of a float32 vector (each float32 read back exactly)."""
    return "[" + ",".join(map(repr, np.asarray(vec, dtype=np.float32).tolist())) + "]"


def write(conn: Any, ids: Sequence[str], vectors: np.ndarray, windows: Sequence[np.ndarray]) -> None:
    """Store passage `ids[i]`'s vector and windows (inside the writer's transaction), by COPY."""
    if not len(ids):
        return
    with conn.cursor() as cur, cur.copy("COPY chunk_vecs (id, part, vec) FROM STDIN") as copy:
        for cid, vec, wins in zip(ids, vectors, windows, strict=True):
            copy.write(f"{cid}\t0\t{text(vec)}\n")
            for part, w in enumerate(wins, 1):
                copy.write(f"{cid}\t{part}\t{text(w)}\n")


def delete(conn: Any, ids: Sequence[str] | None) -> None:
    """Delete the vectors of `ids` (None: of every chunk no longer in `chunks`)."""
    if ids is None:
        conn.execute("DELETE FROM chunk_vecs v WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.id = v.id)")
    elif ids:
        conn.execute("DELETE FROM chunk_vecs WHERE id = ANY(%s)", (list(ids),))


# the generation the statement saw, -1 while its vectors are not all stored yet
_GENERATION = ("SELECT NULL::text, (SELECT CASE WHEN g.value = v.value THEN g.value::float8 ELSE -1 END FROM meta g "
               "JOIN meta v ON g.key = 'generation' AND v.key = 'vectors_generation')")
_EXACT = f"""{_GENERATION}
UNION ALL SELECT id, max(-(vec <#> %(q)s::vector))::float8 FROM chunk_vecs GROUP BY id"""
# an approximate top: the HNSW index's nearest rows (iterated past the first ef_search when the
# filter leaves too few), the best per passage
_NEAREST = f"""{_GENERATION}
UNION ALL SELECT id, max(score) FROM (SELECT id, -(vec <#> %(q)s::vector)::float8 AS score FROM chunk_vecs
    ORDER BY vec <#> %(q)s::vector LIMIT %(rows)s) x GROUP BY id"""


class _Stale(Exception):
    """The server's vectors are of another generation than the client's chunk order."""


class ServerDense:
    """The dense scores of the passages `ids` (in position order, of vectors generation
    `generation`) for a query vector, computed by the server; `DenseRetriever.remote` is set to
    this object's `scores`. Raises `_Stale` when the store has moved on."""

    def __init__(self, conn: Any, ids: Sequence[str], generation: str, *, exact_below: int | None = None) -> None:
        self.conn, self.generation = conn, generation
        self.ids = list(ids)
        self.row_of = {cid: row for row, cid in enumerate(self.ids)}
        self.exact = len(self.ids) < (EXACT_BELOW if exact_below is None else exact_below)
        self.statements = 0  # statements run, for tests and benches
        self._tuned = False

    def _run(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, Any]]:
        self.statements += 1
        rows = self.conn.execute(sql, params).fetchall()
        generation = next((str(int(score or 0)) for cid, score in rows if cid is None), None)
        if generation != self.generation:
            raise _Stale
        return [(cid, score) for cid, score in rows if cid is not None]

    def scores(self, qv: np.ndarray) -> np.ndarray:
        """Every passage's score (exact: MaxP over its vector and windows)."""
        out = np.zeros(len(self.ids), dtype=np.float32)
        for cid, score in self._run(_EXACT, {"q": text(qv)}):
            if (row := self.row_of.get(cid)) is not None:
                out[row] = score
        return out

    def top(self, qv: np.ndarray, k: int) -> list[tuple[int, float]] | None:
        """The `k` best (position, score) by the HNSW index, or None when the store is small
        enough to score exactly."""
        if self.exact:
            return None
        if not self._tuned:  # (the index's own connection: for its session)
            self.conn.execute(f"SET hnsw.ef_search = {HNSW_EF}")
            self.conn.execute("SET hnsw.iterative_scan = relaxed_order")
            self._tuned = True
        found = self._run(_NEAREST, {"q": text(qv), "rows": 8 * k})
        hits = [(self.row_of[cid], float(score)) for cid, score in found if cid in self.row_of]
        hits.sort(key=lambda h: (-h[1], h[0]))
        return [(pos, float(np.float32(score))) for pos, score in hits[:k]]
