"""Vectors, windows and the neighbour graph of a PostgreSQL index as rows, and each process's copy.

Rows (tables of the index's schema, beside `chunks`):
  chunk_vectors(id, vec, windows)   per chunk: its float32 vector and its windows' (0..n of them),
                                    valid for the embedder and window scheme named in `meta`
  chunk_graph(id, stamp, nbrs, sims, label)  per chunk: its neighbours (chunk ids), their cosines, its
                                    HNSW label (above the ANN threshold); `stamp` orders the writes
A change writes the rows of its own chunks (and the graph rows it changed), never the rest.

`RowCache` is what a process holds: chunk texts and vectors by chunk id (an id names its text, so
a cached one never goes stale), the graph by id with the last stamp read, and the chunk order of
the last two generations (ids and slots, `Order`), and the vectors of the last generation laid out
per slot (`Laid`, what the search uses). Each vector is held once: by slot when laid out, else by
id in a pool (read or written, not laid out yet); a layout made anew takes the vectors it had from
the one before. A new generation costs the ids and slots in slot order (one short row each) plus
the rows the process has not seen, and laying out only the slots it adds. One cache per server and
index, shared by the Index objects of a process (`cache_for`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from tether.rag._chunking import Chunk

SCHEMA = """
CREATE TABLE IF NOT EXISTS chunk_vectors (id TEXT PRIMARY KEY, vec BYTEA NOT NULL, windows BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS chunk_graph (id TEXT PRIMARY KEY, stamp BIGINT NOT NULL, nbrs TEXT NOT NULL,
    sims BYTEA NOT NULL, label BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS chunk_graph_stamp ON chunk_graph(stamp);
CREATE SEQUENCE IF NOT EXISTS row_stamps
"""


_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """Run a RowCache method under its lock (Index objects on several threads share a cache)."""
    @functools.wraps(method)
    def run(self: RowCache, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


class _Pool:
    """Vectors appended by id into one growing array (and windows into another): those read or
    written that are not laid out yet (`Laid` holds the rest, once)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.vecs = np.zeros((0, dim), dtype=np.float32)
        self.wins = np.zeros((0, dim), dtype=np.float32)
        self.n = self.nw = 0
        self.slot: dict[str, tuple[int, int, int]] = {}  # id -> (vector slot, first window, windows)

    @staticmethod
    def _grow(arr: np.ndarray, need: int) -> np.ndarray:
        if need <= len(arr):
            return arr
        out = np.zeros((max(need, 2 * len(arr), 64), arr.shape[1]), dtype=np.float32)
        out[: len(arr)] = arr
        return out

    def add(self, cid: str, vec: np.ndarray, wins: np.ndarray) -> None:
        self.vecs = self._grow(self.vecs, self.n + 1)
        self.wins = self._grow(self.wins, self.nw + len(wins))
        self.vecs[self.n] = vec
        self.wins[self.nw : self.nw + len(wins)] = wins
        self.slot[cid] = (self.n, self.nw, len(wins))
        self.n += 1
        self.nw += len(wins)

    def add_many(self, ids: Sequence[str], vecs: np.ndarray, wins: np.ndarray, lens: np.ndarray) -> None:
        """Append `ids` with their `vecs` and windows (`wins`, `lens` of each id, in order) at once
        (taken as they are when the pool is empty)."""
        firsts = self.nw + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        if self.n == 0 and self.nw == 0:
            self.vecs, self.wins = vecs, wins
        else:
            self.vecs = self._grow(self.vecs, self.n + len(ids))
            self.wins = self._grow(self.wins, self.nw + len(wins))
            self.vecs[self.n : self.n + len(ids)] = vecs
            self.wins[self.nw : self.nw + len(wins)] = wins
        self.slot.update(zip(ids, zip(range(self.n, self.n + len(ids)), firsts.tolist(), lens.tolist(),
                                      strict=True), strict=True))
        self.n += len(ids)
        self.nw += len(wins)

    def compacted(self, live: Sequence[str]) -> _Pool:
        """A pool of the `live` ids only (the rest were laid out or deleted from the index)."""
        out = _Pool(self.dim)
        for cid in live:
            at, first, n = self.slot[cid]
            out.add(cid, self.vecs[at], self.wins[first : first + n])
        return out


class Laid:
    """The vectors and windows of the slots below `n` laid out per slot (a slot without a live id:
    whatever it held, or zeros), in buffers that grow: rows below `n` (windows below `nw`) are never
    written again, so the arrays handed out, views of them, stay valid while later slots are added."""

    def __init__(self, key: str, dim: int) -> None:
        self.key = key
        self.vecs = np.zeros((0, dim), dtype=np.float32)
        self.wins = np.zeros((0, dim), dtype=np.float32)
        self.owner = np.zeros(0, dtype=np.int64)
        self.ids = np.zeros(0, dtype=object)  # slot -> the id laid out there (None: none)
        self.where: dict[str, int] = {}  # id -> the slot it is laid out at (the last one)
        self.n = self.nw = 0

    @staticmethod
    def _grow(arr: np.ndarray, used: int, need: int) -> np.ndarray:
        """`arr`, or a copy of its first `used` rows with room for `need` and a sixteenth more (the
        next changes fit without a copy; doubling would double the memory of a large store)."""
        if need <= len(arr):
            return arr
        out = np.zeros((need + need // 16 + 1024, *arr.shape[1:]), dtype=arr.dtype)
        out[:used] = arr[:used]
        return out

    def matches(self, slots: np.ndarray, ids: np.ndarray) -> bool:
        """Whether the ids at `slots` (those below `n`) are the ones laid out there."""
        below = slots < self.n
        return bool(np.array_equal(self.ids[slots[below]], ids[below]))

    def append(self, upto: int, at: np.ndarray, ids: Sequence[str | None], vectors: np.ndarray, windows: np.ndarray,
               owner: np.ndarray) -> None:
        """Lay out the slots from `n` to `upto`: `ids` with their `vectors` at slots `at` (ascending,
        from `n` on), `windows` owned by those slots (`owner`, ascending); the other slots zeros."""
        self.vecs = self._grow(self.vecs, self.n, upto)
        self.wins = self._grow(self.wins, self.nw, self.nw + len(windows))
        self.ids = self._grow(self.ids, self.n, upto)
        self.owner = self._grow(self.owner, self.nw, self.nw + len(windows))
        self.vecs[self.n : upto] = 0
        self.ids[self.n : upto] = None
        self.vecs[at] = vectors
        self.ids[at] = np.asarray(ids, dtype=object)
        self.where.update((c, s) for c, s in zip(ids, at.tolist(), strict=True) if c is not None)
        self.wins[self.nw : self.nw + len(windows)] = windows
        self.owner[self.nw : self.nw + len(windows)] = owner
        self.n, self.nw = upto, self.nw + len(windows)

    def windows_of(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first window, number of windows) of each of `slots` (laid out ones)."""
        owner = self.owner[: self.nw]
        first = np.searchsorted(owner, slots)
        return first, np.searchsorted(owner, slots + 1) - first

    def views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vectors, windows, owner) of the slots laid out, read-only."""
        out = self.vecs[: self.n], self.wins[: self.nw], self.owner[: self.nw]
        for arr in out:
            arr.flags.writeable = False
        return out


class Order(NamedTuple):
    """The live chunks of a generation: their ids in slot order, their slots (ascending; search
    position i is `ids[i]` at `slots[i]`) and how many slots the store has, dead ones included."""

    ids: list[str]
    slots: np.ndarray
    total: int


class RowCache:
    """A process's copy of an index's rows (see the module docstring). The caller holds the index's
    swap lock (shared) while it refreshes, so what it reads is of one generation."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.orders: dict[str, Order] = {}  # generation -> its chunk ids and slots (the last two)
        self.chunks: dict[str, Chunk] = {}
        self.vec_key = ""
        self.pool: _Pool | None = None
        self.graph_stamp = 0
        self.graph: dict[str, tuple[str, bytes, int]] = {}  # id -> (neighbour ids, cosines, label)
        self.downloaded = {"orders": 0, "chunks": 0, "vectors": 0, "graph": 0}  # rows read, for tests and benches
        self.laid: Laid | None = None  # the vectors of the last generation read or written, per slot
        self.laid_slots = 0  # slots laid out (copied into the arrays per slot), for tests and benches
        self.graph_rows_made = 0  # neighbour rows formatted to compare or store, for tests

    # -- chunk order and texts ------------------------------------------------------------------

    @_locked
    def order(self, db: Any, generation: str) -> Order:
        """The chunk ids of `generation` (the current one) in slot order, with their slots."""
        found = self.orders.get(generation)
        if found is None:
            rows = db.execute("SELECT -1, value FROM meta WHERE key = 'slots' UNION ALL "
                              "SELECT row, id FROM chunks ORDER BY 1").fetchall()
            total = int(rows[0][1]) if rows and rows[0][0] == -1 else None
            rows = rows[1:] if total is not None else rows
            slots = np.fromiter((r for r, _ in rows), dtype=np.int64, count=len(rows))
            found = Order([str(c) for _, c in rows], slots,
                          total if total is not None else (int(slots[-1]) + 1 if len(slots) else 0))
            self.downloaded["orders"] += 1
            self.remember_order(generation, found)
        return found

    @_locked
    def remember_order(self, generation: str, order: Order) -> None:
        self.orders = {g: o for g, o in self.orders.items() if g == str(int(generation) - 1)}
        self.orders[generation] = order

    @_locked
    def chunk_rows(self, db: Any, ids: Sequence[str]) -> list[Chunk]:
        missing = [c for c in ids if c not in self.chunks]
        if missing:
            sql = "SELECT id, source, position, heading, text FROM chunks"
            rows = (db.execute(sql).fetchall() if len(missing) == len(ids)
                    else db.execute(sql + " WHERE id = ANY(%s)", (missing,)).fetchall())
            self.downloaded["chunks"] += len(rows)
            for r in rows:
                self.chunks[r[0]] = Chunk(*r)
        if len(self.chunks) > 2 * max(len(ids), 1000):  # deleted passages: keep the live ones only
            self.chunks = {c: self.chunks[c] for c in ids}
        return [self.chunks[c] for c in ids]

    # -- vectors ------------------------------------------------------------------------------------

    @_locked
    def vectors(self, db: Any, ids: Sequence[str], key: str, dim: int,
                keep: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(vectors, windows, owner, have) of those `ids` that have a vector row for the vector key
        `key` (embedder and windows): `have` marks them among `ids`, owner numbers the windows by
        their id's place among the ones had. `keep` (default `ids`): the ids still in use."""
        keep = ids if keep is None else keep
        self.use_key(key, dim)
        pool = self.pool
        assert pool is not None
        where = self._laid_where()
        missing = [c for c in ids if c not in where and c not in pool.slot]
        if missing:
            sql = "SELECT id, vec, windows FROM chunk_vectors"  # (binary: bytea is not sent as hex)
            rows = (db.execute(sql, binary=True).fetchall() if len(missing) == len(keep)
                    else db.execute(sql + " WHERE id = ANY(%s)", (missing,), binary=True).fetchall())
            self.downloaded["vectors"] += len(rows)
            rows = [r for r in rows if r[0] not in where and r[0] not in pool.slot]
            if rows:  # (decoded at once: one join of the rows' bytes, not an array per row)
                vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), dim)
                lens = np.fromiter((len(r[2]) // (4 * dim) for r in rows), dtype=np.int64, count=len(rows))
                wins = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(-1, dim)
                got = [str(r[0]) for r in rows]
                del rows  # (the rows' bytes: the arrays are copies)
                pool.add_many(got, vecs, wins, lens)
        if pool.n > 2 * max(len(keep), 1000):
            self.pool = pool = pool.compacted([c for c in keep if c in pool.slot])
        have = np.fromiter((c in where or c in pool.slot for c in ids), dtype=bool, count=len(ids))
        return (*self._gather([c for c in ids if c in where or c in pool.slot]), have)

    def _laid_where(self) -> dict[str, int]:
        """id -> slot of the last layout when it is of the current vector key, else empty."""
        laid = self.laid
        ok = laid is not None and self.pool is not None and laid.key == self.vec_key and \
            laid.vecs.shape[1] == self.pool.dim
        return laid.where if ok and laid is not None else {}

    def _gather(self, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vectors, windows, owner) of `ids` (each laid out or in the pool), in that order (owner:
        the position of each window's id)."""
        pool, laid, where = self.pool, self.laid, self._laid_where()
        assert pool is not None
        m = len(ids)
        in_laid = np.zeros(m, dtype=bool)
        row, first, lens = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
        for i, cid in enumerate(ids):
            s = where.get(cid)
            if s is not None:
                in_laid[i], row[i] = True, s
            else:
                row[i], first[i], lens[i] = pool.slot[cid]
        vectors = np.empty((m, pool.dim), dtype=np.float32)
        vectors[~in_laid] = pool.vecs[row[~in_laid]]
        if in_laid.any():
            assert laid is not None
            first[in_laid], lens[in_laid] = laid.windows_of(row[in_laid])
            vectors[in_laid] = laid.vecs[row[in_laid]]
        offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        total = int(lens.sum())
        take = np.repeat(first - offsets, lens) + np.arange(total, dtype=np.int64)
        from_laid = np.repeat(in_laid, lens)
        windows = np.empty((total, pool.dim), dtype=np.float32)
        windows[~from_laid] = pool.wins[take[~from_laid]]
        if from_laid.any():
            assert laid is not None
            windows[from_laid] = laid.wins[take[from_laid]]
        return vectors, windows, np.repeat(np.arange(m, dtype=np.int64), lens)

    def _drop_laid_from_pool(self) -> None:
        """Keep in the pool only the vectors not laid out (each vector is held once)."""
        pool, where = self.pool, self._laid_where()
        if pool is not None and pool.n and any(c in where for c in pool.slot):
            self.pool = pool.compacted([c for c in pool.slot if c not in where])

    @_locked
    def lay_out(self, db: Any, order: Order, extra: dict[int, str], key: str,
                dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(vectors, windows, owner) of `order`'s ids (and `extra`'s: slot -> id) per slot, up to its
        first slot without a vector row (None when no id has one): the last layout with only the
        slots after it added when its slots hold the same ids, else laid out anew."""
        slots, ids = order.slots, order.ids
        if extra:
            pairs = sorted([*zip(slots.tolist(), ids, strict=True), *extra.items()])
            slots = np.asarray([s for s, _ in pairs], dtype=np.int64)
            ids = [c for _, c in pairs]
        id_arr = np.asarray(ids, dtype=object).reshape(len(ids))
        laid = self.laid
        if (laid is None or laid.key != key or laid.vecs.shape[1] != dim or laid.n > order.total
                or not laid.matches(slots, id_arr)):
            laid = Laid(key, dim)
        start = int(np.searchsorted(slots, laid.n))
        vectors, windows, owner, have = self.vectors(db, ids[start:], key, dim, keep=ids)
        if start == 0 and len(ids) and not have.any():
            return None  # (an index written before vectors were rows)
        missing = np.flatnonzero(~have)
        stop = start + (int(missing[0]) if len(missing) else len(have))
        upto = int(slots[stop]) if stop < len(slots) else order.total
        at = slots[start:stop]
        took = stop - start  # (the ids had are the first ones: `vectors` and `owner` are of them)
        wkeep = owner < took
        laid.append(max(upto, laid.n), at, ids[start:stop], vectors[:took], windows[wkeep], at[owner[wkeep]])
        self.laid_slots += len(at)
        self.laid = laid  # (the one before, if any, is let go: the pool has no copy of it)
        self._drop_laid_from_pool()
        return laid.views()  # (taken under the lock: another thread may add slots next)

    @_locked
    def laid_after(self, key: str, dim: int, n: int, ids: dict[int, str], vectors: np.ndarray, windows: np.ndarray,
                   owner: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The last layout (of `key`, `n` slots) with a change's vectors of the slots from `n` on
        added in place (`ids`: the ids of those slots that have one), or None without such a layout."""
        laid = self.laid
        if laid is None or laid.key != key or laid.vecs.shape[1] != dim or laid.n != n:
            return None
        at = np.arange(n, n + len(vectors), dtype=np.int64)
        laid.append(n + len(vectors), at, [ids.get(int(s)) for s in at], vectors, windows, owner)
        self.laid_slots += len(at)
        self._drop_laid_from_pool()
        return laid.views()

    @_locked
    def adopt(self, key: str, ids: Sequence[str | None], vectors: np.ndarray, windows: np.ndarray,
              owner: np.ndarray) -> None:
        """Lay out a change's arrays per slot (`ids`: the id of each slot, None for none) as they are,
        with room for the next changes (a whole ingest: its first search then lays out nothing)."""
        self.use_key(key, vectors.shape[1])
        laid = Laid(key, vectors.shape[1])
        laid.append(len(vectors), np.arange(len(vectors), dtype=np.int64), ids, vectors, windows,
                    np.asarray(owner, dtype=np.int64))
        self.laid = laid
        self._drop_laid_from_pool()

    @_locked
    def use_key(self, key: str, dim: int) -> None:
        """Vectors of `key` (embedder and windows) from now on: another key empties the copy."""
        if self.vec_key != key or self.pool is None or self.pool.dim != dim:
            self.vec_key, self.pool = key, _Pool(dim)

    @_locked
    def add_vector(self, cid: str, vec: np.ndarray, wins: np.ndarray) -> None:
        assert self.pool is not None
        if cid not in self.pool.slot and cid not in self._laid_where():
            self.pool.add(cid, vec, wins)

    # -- the neighbour graph ----------------------------------------------------------------------

    @_locked
    def refresh_graph(self, db: Any) -> None:
        """Read the graph rows written since the last read (rows of deleted passages may linger
        here: they are never asked for, and a passage new to a generation has its row written)."""
        rows = db.execute("SELECT id, stamp, nbrs, sims, label FROM chunk_graph WHERE stamp > %s",
                          (self.graph_stamp,), binary=True).fetchall()
        self.downloaded["graph"] += len(rows)
        for cid, stamp, nbrs, sims, label in rows:
            self.graph[cid] = (nbrs, bytes(sims), int(label))
            self.graph_stamp = max(self.graph_stamp, int(stamp))

    @_locked
    def graph_arrays(self, ids: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(rows, sims, labels) of `ids` (rows: n x k neighbour rows), or None when a row is missing
        or names a passage not among `ids`."""
        row_of = {c: i for i, c in enumerate(ids)}
        n = len(ids)
        got = [self.graph.get(c) for c in ids]
        if any(g is None or len(g[1]) != 4 * k or (g[0].count(",") + 1 if g[0] else 0) != k
               for g in got):
            return None
        rows_got: list[tuple[str, bytes, int]] = got  # type: ignore[assignment]
        names = ",".join(g[0] for g in rows_got if g[0]).split(",") if k else []
        rows = np.fromiter((row_of.get(c, -1) for c in names), dtype=np.int64, count=len(names))
        if (rows < 0).any():
            return None
        sims = np.frombuffer(b"".join(g[1] for g in rows_got), dtype=np.float32).reshape(n, k).copy()
        labels = np.fromiter((g[2] for g in rows_got), dtype=np.int64, count=n)
        return rows.astype(np.int32).reshape(n, k), sims, labels

    def graph_rows(self, ids: list[str], rows: np.ndarray, sims: np.ndarray, labels: np.ndarray | None,
                   names: list[str] | None = None) -> list[tuple[str, str, bytes, int]]:
        """The graph rows of `ids` (neighbours: positions in `names`, default `ids`), as stored: (id,
        neighbour ids, cosines, label)."""
        names = ids if names is None else names
        self.graph_rows_made += len(ids)
        out = []
        for i, cid in enumerate(ids):
            nbrs = ",".join(names[j] for j in rows[i].tolist())
            out.append((cid, nbrs, np.asarray(sims[i], dtype=np.float32).tobytes(),
                        int(labels[i]) if labels is not None else -1))
        return out


_CACHES: dict[str, RowCache] = {}
_CACHES_LOCK = threading.Lock()


def cache_for(location: str) -> RowCache:
    """The process's cache of the index at `location` (server and index name)."""
    with _CACHES_LOCK:
        return _CACHES.setdefault(location, RowCache())


def copy_rows(conn: Any, table: str, columns: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert `rows` into `table` by COPY (inside the caller's transaction)."""
    if not rows:
        return
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
