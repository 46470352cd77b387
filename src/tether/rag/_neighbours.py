"""The neighbour state of a stored index, carried from one generation to the next.

Two things derived from the whole-text vectors, both kept per slot (a passage's stable place in
the store; a removed passage's slot stays, dead, until the store is compacted) and updated per
change instead of rebuilt:
  graph   each live slot's `k` nearest other live slots and their cosines, which `best` smooths
          over. A change marks the removed slots dead, finds the neighbours of the new slots and of
          the slots that lost one, and offers every new slot to the slots it is nearer to than their
          current last neighbour; the rest stays.
  ann     above the index's ANN threshold, an HNSW graph (hnswlib) the dense search asks for its
          candidates and the graph update asks for neighbours; removed slots are marked deleted (a
          tombstone; hnswlib reuses their memory for later additions), new slots added. Labels are
          stable ids, `labels[slot]` the one of each slot (-1: dead). Its file (`base`) is written
          only now and then: in between, the state keeps the changes made since (`log`: per change
          the labels deleted, the slots added and their labels), which a loader replays in order on
          the base, so every process holds the same graph as the writer without a rewrite of the
          whole file per change.

Below the threshold neighbours are found by exact search, so the graph equals `knn_graph`'s up to
ties. hnswlib inserts on one thread and seeds its levels with 0: the same changes give the same
graph. Built on all cores for a first build of a large store (faster; not bit-for-bit repeatable).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tether._errors import MissingDependency
from tether.rag._dense import knn_graph

M, EF_CONSTRUCTION = 16, 100
CANDIDATES = 200  # rows a dense query scores exactly (with their windows) above the threshold
LOG_LIMIT = 256  # HNSW additions kept as a log before the file is written again (a replay inserts them)
_BULK = 10_000  # a first build of more rows than this runs on all cores


def _hnswlib() -> Any:
    try:
        import hnswlib
    except ImportError as exc:  # the [rag] extra
        raise MissingDependency("an index above its ANN threshold needs hnswlib: pip install 'tether[rag]'") from exc
    return hnswlib


class HNSW:
    """An hnswlib index over unit vectors with stable labels; `candidates` serves DenseRetriever
    (it answers slots)."""

    def __init__(self, index: Any, labels: np.ndarray, next_label: int) -> None:
        self.index = index
        self.labels = labels.astype(np.int64)  # per slot, -1 for a dead one
        self.next_label = next_label  # never reused: hnswlib puts a new label in a deleted one's slot
        self._slot_of: np.ndarray | None = None

    @classmethod
    def build(cls, vectors: np.ndarray, live: np.ndarray | None = None) -> HNSW:
        hnswlib = _hnswlib()
        n, dim = vectors.shape
        live = np.arange(n) if live is None else np.asarray(live, dtype=np.int64)
        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=max(len(live), 1) * 2, M=M, ef_construction=EF_CONSTRUCTION, random_seed=0,
                         allow_replace_deleted=True)
        index.set_num_threads((os.cpu_count() or 1) if len(live) > _BULK else 1)
        if len(live):
            index.add_items(np.asarray(vectors[live], dtype=np.float32), live)
        index.set_num_threads(1)
        labels = np.full(n, -1, dtype=np.int64)
        labels[live] = live
        return cls(index, labels, n)

    @property
    def count(self) -> int:
        """How many live vectors the index holds."""
        return int((self.labels >= 0).sum())

    def rows(self, labels: np.ndarray) -> np.ndarray:
        """The slots of `labels`."""
        if self._slot_of is None:
            self._slot_of = np.full(self.next_label, -1, dtype=np.int64)
            have = np.flatnonzero(self.labels >= 0)
            self._slot_of[self.labels[have]] = have
        return self._slot_of[labels.astype(np.int64)]

    def query(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(slots, cosines) of the `k` nearest live slots of each vector, nearest first."""
        k = min(k, self.count)
        if k == 0 or not len(vectors):
            return np.zeros((len(vectors), 0), dtype=np.int64), np.zeros((len(vectors), 0), dtype=np.float32)
        self.index.set_ef(max(2 * k, 128))  # 64 gave recall@10 .92 on 8,000 unstructured vectors, 128 .97
        # Queries only read the graph: on all cores for many (the same answers, in a fraction of the wall time).
        self.index.set_num_threads((os.cpu_count() or 1) if len(vectors) > _BULK else 1)
        try:
            labels, dist = self.index.knn_query(np.asarray(vectors, dtype=np.float32), k=k)
        finally:
            self.index.set_num_threads(1)
        return self.rows(labels), (1.0 - dist).astype(np.float32)

    def candidates(self, query: np.ndarray) -> np.ndarray:
        """Slots near the query (DenseRetriever scores them exactly, windows included)."""
        return self.query(query[None, :], CANDIDATES)[0][0]

    def update(self, dropped: np.ndarray, new: np.ndarray, vectors: np.ndarray) -> None:
        """Mark the slots `dropped` deleted and add the slots `new` (after all others) with `vectors`."""
        for label in self.labels[dropped].tolist():
            if label >= 0:
                self.index.mark_deleted(label)
        self.labels[dropped] = -1
        if len(new):
            end = int(new[-1]) + 1
            self.labels = np.concatenate([self.labels, np.full(max(end - len(self.labels), 0), -1, dtype=np.int64)])
            added = np.arange(self.next_label, self.next_label + len(new))
            self.next_label += len(new)
            if self.index.element_count + len(new) > self.index.max_elements:
                self.index.resize_index((self.index.element_count + len(new)) * 2)
            self.index.add_items(np.asarray(vectors, dtype=np.float32), added, replace_deleted=True)
            self.labels[new] = added
        self._slot_of = None

    def relabel(self, labels: np.ndarray, next_label: int) -> None:
        """Set the label of each slot (-1: dead) and the next label to give, as stored."""
        self.labels, self.next_label, self._slot_of = labels.astype(np.int64), next_label, None

    def replay(self, deleted: np.ndarray, vectors: np.ndarray, added: np.ndarray) -> None:
        """One logged change as the writer made it: the labels `deleted` marked deleted, then
        `vectors` added under the labels `added` (the slots' labels are the caller's to set)."""
        for label in deleted.tolist():
            self.index.mark_deleted(label)
        if len(added):
            if self.index.element_count + len(added) > self.index.max_elements:
                self.index.resize_index((self.index.element_count + len(added)) * 2)
            self.index.add_items(np.asarray(vectors, dtype=np.float32), added, replace_deleted=True)

    def compact(self, live: np.ndarray) -> None:
        """Renumber the slots `live` to 0..len(live)-1 (the store was compacted); labels stay."""
        self.labels = self.labels[live]
        self._slot_of = None

    def save(self, path: Path) -> None:
        self.index.save_index(str(path))

    @classmethod
    def load(cls, path: Path, labels: np.ndarray, next_label: int, dim: int) -> HNSW:
        index = _hnswlib().Index(space="ip", dim=dim)
        index.load_index(str(path), allow_replace_deleted=True)
        index.set_num_threads(1)
        return cls(index, labels, next_label)


class Neighbours:
    """The graph (`rows`, `sims`: slots x k, nearest first; a dead slot's row means nothing) and,
    above the threshold, the HNSW index."""

    def __init__(self, rows: np.ndarray, sims: np.ndarray, ann: HNSW | None) -> None:
        self.rows, self.sims, self.ann = rows.astype(np.int32), sims.astype(np.float32), ann
        self.base = ""  # the stored HNSW file the log applies to ("": none yet)
        self.log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (deleted labels, added slots, their labels)
        self.touched: np.ndarray | None = None  # slots whose row `update` changed since it was stored (None: unknown)

    @property
    def rebase_due(self) -> bool:
        """Whether the HNSW index should be written whole with the next save (no file yet, or a log
        long enough that replaying it would cost more than the write)."""
        return self.ann is not None and (not self.base or sum(len(a) for _, a, _ in self.log) > LOG_LIMIT)

    @property
    def k(self) -> int:
        return int(self.rows.shape[1])

    @classmethod
    def build(cls, vectors: np.ndarray, k: int, use_ann: bool, live: np.ndarray | None = None) -> Neighbours:
        """Everything from the vectors of the `live` slots (default: all); a first ingest, another
        embedder, a crossed threshold."""
        vectors = np.asarray(vectors, dtype=np.float32)
        n = len(vectors)
        live = np.arange(n) if live is None else np.asarray(live, dtype=np.int64)
        ann = HNSW.build(vectors, live) if use_ann else None
        me = cls(np.zeros((n, 0)), np.zeros((n, 0)), ann)
        k = min(k, max(len(live) - 1, 0))
        if not k:
            return me
        me.rows = np.repeat(np.arange(n, dtype=np.int32)[:, None], k, axis=1)
        me.sims = np.zeros((n, k), dtype=np.float32)
        if ann is None:
            lv = vectors[live] if len(live) != n else vectors
            found = knn_graph(lv, k)
            me.rows[live] = live[found]
            me.sims[live] = np.einsum("nd,nkd->nk", lv, lv[found])
        else:
            mask = np.zeros(n, dtype=bool)
            mask[live] = True
            me.rows[live], me.sims[live] = me._search(vectors, live, k, mask)
        return me

    def _search(self, vectors: np.ndarray, rows: np.ndarray, k: int, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The `k` nearest other live slots of the slots `rows` (and their cosines): by the HNSW
        index when there is one, else exactly, in blocks. `live` is a mask over the slots."""
        out_rows = np.zeros((len(rows), k), dtype=np.int32)
        out_sims = np.full((len(rows), k), -np.inf, dtype=np.float32)
        if not len(rows) or not k:
            return out_rows, out_sims
        if self.ann is not None:
            found, sims = self.ann.query(vectors[rows], k + 1)
            order = np.argsort(found == rows[:, None], axis=1, kind="stable")  # each slot itself last
            found = np.take_along_axis(found, order, axis=1)[:, :k]
            sims = np.take_along_axis(sims, order, axis=1)[:, :k]
            own = found == rows[:, None]  # too few found: point at itself (as knn_graph does)
            out_rows[:, : found.shape[1]] = np.where(own, rows[:, None], found)
            out_sims[:, : found.shape[1]] = np.where(own, -np.inf, sims)
            out_rows[:, found.shape[1] :] = rows[:, None]
            return out_rows, out_sims
        dead = np.flatnonzero(~live)
        for start in range(0, len(rows), 256):
            part = rows[start : start + 256]
            sims = np.asarray(vectors[part] @ vectors.T, dtype=np.float32)
            sims[np.arange(len(part)), part] = -np.inf
            sims[:, dead] = -np.inf
            top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
            top = np.take_along_axis(top, order, axis=1)
            out_rows[start : start + len(part)] = top
            out_sims[start : start + len(part)] = np.take_along_axis(sims, top, axis=1)
        return out_rows, out_sims

    def update(self, vectors: np.ndarray, dropped: np.ndarray, live: np.ndarray | None = None) -> None:
        """Carry the state to the store whose vectors (per slot) are `vectors`: the slots `dropped`
        now dead, the slots after the old ones new (those in `live`, ascending; default all). Costs
        the change, not the store, except for one pass of the new vectors over all vectors."""
        vectors = np.asarray(vectors, dtype=np.float32)
        dropped = np.asarray(dropped, dtype=np.int64)
        old_n, n = len(self.rows), len(vectors)
        mask = np.ones(n, dtype=bool)
        if live is not None:
            mask[:] = False
            mask[np.asarray(live, dtype=np.int64)] = True
        mask[dropped] = False
        new = old_n + np.flatnonzero(mask[old_n:])
        if self.ann is not None:
            deleted = self.ann.labels[dropped]
            first = self.ann.next_label
            self.ann.update(dropped, new, vectors[new])
            self.log.append((deleted[deleted >= 0], new, np.arange(first, first + len(new))))
        k = self.k
        if not k:
            self.rows, self.sims = np.zeros((n, 0), dtype=np.int32), np.zeros((n, 0), dtype=np.float32)
            return
        if min(k, int(mask.sum()) - 1) < k:  # a store that shrank below k + 1 passages: rebuild (tiny)
            fresh = Neighbours.build(vectors, k, False, np.flatnonzero(mask))
            self.rows, self.sims, self.touched = fresh.rows, fresh.sims, None
            return
        rows = np.concatenate([self.rows.astype(np.int64), np.repeat(np.arange(old_n, n)[:, None], k, axis=1)])
        sims = np.concatenate([self.sims, np.zeros((n - old_n, k), dtype=np.float32)])
        kept = np.flatnonzero(mask[:old_n])
        changed: list[int] = []
        lost = np.zeros(n, dtype=bool)
        if len(dropped):
            lost[kept] = np.isin(rows[kept], dropped).any(axis=1)
        if len(new):  # a new slot nearer than a kept slot's last neighbour takes its place
            for start in range(0, len(new), 256):
                part = new[start : start + 256]
                cross = np.asarray(vectors @ vectors[part].T, dtype=np.float32)[kept]  # kept x part (no copy of the store)
                better = cross > sims[kept, -1:]
                for j in np.flatnonzero(better.any(axis=1) & ~lost[kept]).tolist():
                    i = kept[j]
                    cand_rows = np.concatenate([rows[i], part[better[j]]])
                    cand_sims = np.concatenate([sims[i], cross[j][better[j]]])
                    order = np.argsort(-cand_sims, kind="stable")[:k]
                    rows[i], sims[i] = cand_rows[order], cand_sims[order]
                    changed.append(i)
        redo = np.concatenate([np.flatnonzero(lost), new])
        self.rows, self.sims = rows.astype(np.int32), sims
        self.rows[redo], self.sims[redo] = self._search(vectors, redo, k, mask)
        if self.touched is not None:
            self.touched = np.union1d(self.touched, np.concatenate([np.asarray(changed, dtype=np.int64), redo]))

    def compact(self, live: np.ndarray) -> None:
        """Renumber the slots `live` to 0..len(live)-1 (the store was compacted)."""
        live = np.asarray(live, dtype=np.int64)
        new_slot = np.full(len(self.rows), -1, dtype=np.int64)
        new_slot[live] = np.arange(len(live))
        self.rows, self.sims = new_slot[self.rows[live]].astype(np.int32), self.sims[live]
        self.touched = None
        if self.ann is not None:
            self.ann.compact(live)
            self.base, self.log = "", []  # the log names slots: write the file with the next save

    def positions(self, live: np.ndarray) -> np.ndarray:
        """The graph by position: row i for the i-th live slot, neighbours as positions."""
        pos = np.full(len(self.rows), -1, dtype=np.int64)
        pos[live] = np.arange(len(live))
        return pos[self.rows[live]].astype(np.int32)

    # -- storage: one .npz (the graph, the labels and the generation it is of) plus the HNSW file --

    def save(self, path: Path, key: str, ann_name: str) -> None:
        """The graph, the labels and the log since the HNSW file `ann_name` (this state's own when it
        was just written: the log is then empty)."""
        if ann_name != self.base:
            self.base, self.log = ann_name, []
        arrays: dict[str, Any] = {"rows": self.rows, "sims": self.sims, "key": np.array(key), "ann": np.array(ann_name)}
        if self.ann is not None:
            arrays["labels"], arrays["next_label"] = self.ann.labels, np.array(self.ann.next_label)
            for name, i in (("log_deleted", 0), ("log_slots", 1), ("log_labels", 2)):
                arrays[name] = np.concatenate([np.zeros(0, dtype=np.int64)] + [np.asarray(e[i], dtype=np.int64) for e in self.log])
                arrays[name + "_n"] = np.asarray([len(e[i]) for e in self.log], dtype=np.int64)
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)

    @staticmethod
    def stored_key(path: Path) -> tuple[str, str]:
        """(the key the stored state was saved for, the name of its HNSW file or '')."""
        with np.load(path, allow_pickle=False) as z:
            return str(z["key"]), str(z["ann"])

    @classmethod
    def load(cls, path: Path, ann_file: Path | None, vectors: np.ndarray) -> Neighbours:
        """The stored state; its HNSW index is the file `ann_file` with the log replayed (new slots'
        vectors taken from `vectors`, per slot)."""
        with np.load(path, allow_pickle=False) as z:
            rows, sims, base = z["rows"], z["sims"], str(z["ann"])
            if ann_file is None or "labels" not in z:
                return cls(rows, sims, None)
            labels, next_label = z["labels"], int(z["next_label"])
            parts = {name: np.split(z[name], np.cumsum(z[name + "_n"])[:-1]) if len(z[name + "_n"]) else []
                     for name in ("log_deleted", "log_slots", "log_labels")} if "log_deleted_n" in z else None
        log = list(zip(*parts.values(), strict=True)) if parts else []
        ann = HNSW.load(ann_file, np.zeros(0, dtype=np.int64), 0, vectors.shape[1])
        for deleted, slots, added in log:  # the changes since the file, in order, as the writer made them
            ann.replay(deleted, vectors[slots], added)
        ann.labels, ann.next_label = labels.astype(np.int64), next_label
        me = cls(rows, sims, ann)
        me.base, me.log = base, log
        return me
