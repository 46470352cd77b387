"""The neighbour state of a stored index, carried from one generation to the next.

Two things derived from the whole-text vectors, both updated per change instead of rebuilt:
  graph   each passage's `k` nearest other passages (rows) and their cosines, which `best` smooths
          over. A change drops the removed rows (renumbered like the chunk rows), finds the
          neighbours of the new rows and of the rows that lost one, and offers every new row to the
          rows it is nearer to than their current last neighbour; the rest stays.
  ann     above the index's ANN threshold, an HNSW graph (hnswlib) the dense search asks for its
          candidates and the graph update asks for neighbours; removed rows are marked deleted (their
          slots reused), new rows added. Labels are stable ids, `labels[row]` the one of each row.

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
_BULK = 10_000  # a first build of more rows than this runs on all cores


def _hnswlib() -> Any:
    try:
        import hnswlib
    except ImportError as exc:  # the [rag] extra
        raise MissingDependency("an index above its ANN threshold needs hnswlib: pip install 'tether[rag]'") from exc
    return hnswlib


class HNSW:
    """An hnswlib index over unit vectors with stable labels; `candidates` serves DenseRetriever."""

    def __init__(self, index: Any, labels: np.ndarray, next_label: int) -> None:
        self.index = index
        self.labels = labels.astype(np.int64)
        self.next_label = next_label  # never reused: hnswlib puts a new label in a deleted one's slot
        self._row_of: dict[int, int] | None = None

    @classmethod
    def build(cls, vectors: np.ndarray) -> HNSW:
        hnswlib = _hnswlib()
        n, dim = vectors.shape
        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=max(n, 1) * 2, M=M, ef_construction=EF_CONSTRUCTION, random_seed=0,
                         allow_replace_deleted=True)
        index.set_num_threads(os.cpu_count() or 1 if n > _BULK else 1)
        if n:
            index.add_items(np.asarray(vectors, dtype=np.float32), np.arange(n))
        index.set_num_threads(1)
        return cls(index, np.arange(n), n)

    def rows(self, labels: np.ndarray) -> np.ndarray:
        if self._row_of is None:
            self._row_of = {int(lab): row for row, lab in enumerate(self.labels.tolist())}
        return np.array([self._row_of[int(lab)] for lab in labels.ravel()], dtype=np.int64).reshape(labels.shape)

    def query(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cosines) of the `k` nearest live rows of each vector, nearest first."""
        k = min(k, len(self.labels))
        if k == 0 or not len(vectors):
            return np.zeros((len(vectors), 0), dtype=np.int64), np.zeros((len(vectors), 0), dtype=np.float32)
        self.index.set_ef(max(2 * k, 128))  # 64 gave recall@10 .92 on 8,000 unstructured vectors, 128 .97
        labels, dist = self.index.knn_query(np.asarray(vectors, dtype=np.float32), k=k)
        return self.rows(labels), (1.0 - dist).astype(np.float32)

    def candidates(self, query: np.ndarray) -> np.ndarray:
        """Rows near the query (DenseRetriever scores them exactly, windows included)."""
        return self.query(query[None, :], CANDIDATES)[0][0]

    def update(self, dropped: np.ndarray, new: np.ndarray) -> None:
        """Mark the rows `dropped` deleted and add `new` vectors as rows after the kept ones."""
        for label in self.labels[dropped].tolist():
            self.index.mark_deleted(label)
        self.labels = np.delete(self.labels, dropped)
        if len(new):
            added = np.arange(self.next_label, self.next_label + len(new))
            self.next_label += len(new)
            if self.index.element_count + len(new) > self.index.max_elements:
                self.index.resize_index((self.index.element_count + len(new)) * 2)
            self.index.add_items(np.asarray(new, dtype=np.float32), added, replace_deleted=True)
            self.labels = np.concatenate([self.labels, added])
        self._row_of = None

    def save(self, path: Path) -> None:
        self.index.save_index(str(path))

    @classmethod
    def load(cls, path: Path, labels: np.ndarray, next_label: int, dim: int) -> HNSW:
        index = _hnswlib().Index(space="ip", dim=dim)
        index.load_index(str(path), allow_replace_deleted=True)
        index.set_num_threads(1)
        return cls(index, labels, next_label)


class Neighbours:
    """The graph (`rows`, `sims`: n x k, nearest first) and, above the threshold, the HNSW index."""

    def __init__(self, rows: np.ndarray, sims: np.ndarray, ann: HNSW | None) -> None:
        self.rows, self.sims, self.ann = rows.astype(np.int32), sims.astype(np.float32), ann

    @property
    def k(self) -> int:
        return int(self.rows.shape[1])

    @classmethod
    def build(cls, vectors: np.ndarray, k: int, use_ann: bool) -> Neighbours:
        """Everything from the vectors (a first search, another embedder, a crossed threshold)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        ann = HNSW.build(vectors) if use_ann else None
        me = cls(np.zeros((len(vectors), 0)), np.zeros((len(vectors), 0)), ann)
        k = min(k, max(len(vectors) - 1, 0))
        if k and ann is None:
            rows = knn_graph(vectors, k)
            sims = np.einsum("nd,nkd->nk", vectors, vectors[rows])
            me.rows, me.sims = rows.astype(np.int32), sims.astype(np.float32)
        elif k:
            me.rows, me.sims = me._search(vectors, np.arange(len(vectors)), k)
        return me

    def _search(self, vectors: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The `k` nearest other rows of `rows` (and their cosines): by the HNSW index when there
        is one, else exactly, in blocks."""
        out_rows = np.zeros((len(rows), k), dtype=np.int32)
        out_sims = np.full((len(rows), k), -np.inf, dtype=np.float32)
        if not len(rows) or not k:
            return out_rows, out_sims
        if self.ann is not None:
            found, sims = self.ann.query(vectors[rows], k + 1)
            for i, row in enumerate(rows.tolist()):
                keep = found[i] != row
                got = found[i][keep][:k]
                out_rows[i, : len(got)], out_sims[i, : len(got)] = got, sims[i][keep][:k]
                out_rows[i, len(got) :] = row  # too few found: point at itself (as knn_graph does)
            return out_rows, out_sims
        for start in range(0, len(rows), 256):
            part = rows[start : start + 256]
            sims = np.asarray(vectors[part] @ vectors.T, dtype=np.float32)
            sims[np.arange(len(part)), part] = -np.inf
            top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
            top = np.take_along_axis(top, order, axis=1)
            out_rows[start : start + len(part)] = top
            out_sims[start : start + len(part)] = np.take_along_axis(sims, top, axis=1)
        return out_rows, out_sims

    def update(self, vectors: np.ndarray, dropped: np.ndarray) -> None:
        """Carry the state to the store whose vectors are `vectors`: the old rows minus `dropped`
        (ascending), in order, then the new rows. Costs the change, not the store, except for one
        pass of the new vectors over all vectors."""
        vectors = np.asarray(vectors, dtype=np.float32)
        dropped = np.asarray(dropped, dtype=np.int64)
        old_n = len(self.rows)
        kept = old_n - len(dropped)
        new = np.arange(kept, len(vectors))
        if self.ann is not None:
            self.ann.update(dropped, vectors[kept:])
        k = self.k
        if not k:
            return
        rows = np.delete(self.rows, dropped, axis=0).astype(np.int64)
        sims = np.delete(self.sims, dropped, axis=0)
        lost = np.isin(rows, dropped).any(axis=1) if len(dropped) else np.zeros(len(rows), dtype=bool)
        rows = rows - np.searchsorted(dropped, rows)  # renumbered as the chunk rows are
        if len(new):  # a new row nearer than a kept row's last neighbour takes its place
            for start in range(0, len(new), 256):
                part = new[start : start + 256]
                cross = np.asarray(vectors[:kept] @ vectors[part].T, dtype=np.float32)  # kept x part
                better = cross > sims[:, -1:]
                for i in np.flatnonzero(better.any(axis=1) & ~lost).tolist():
                    cand_rows = np.concatenate([rows[i], part[better[i]]])
                    cand_sims = np.concatenate([sims[i], cross[i][better[i]]])
                    order = np.argsort(-cand_sims, kind="stable")[:k]
                    rows[i], sims[i] = cand_rows[order], cand_sims[order]
        rows = np.concatenate([rows, np.zeros((len(new), k), dtype=np.int64)])
        sims = np.concatenate([sims, np.zeros((len(new), k), dtype=np.float32)])
        redo = np.concatenate([np.flatnonzero(lost), new])
        k_now = min(k, max(len(vectors) - 1, 0))
        if k_now < k:  # a store that shrank below k + 1 rows: rebuild (tiny)
            fresh = Neighbours.build(vectors, k, self.ann is not None)
            self.rows, self.sims = fresh.rows, fresh.sims
            return
        self.rows, self.sims = rows.astype(np.int32), sims
        self.rows[redo], self.sims[redo] = self._search(vectors, redo, k)

    # -- storage: one .npz (the graph, the labels and the generation it is of) plus the HNSW file --

    def save(self, path: Path, key: str, ann_name: str) -> None:
        arrays: dict[str, Any] = {"rows": self.rows, "sims": self.sims, "key": np.array(key), "ann": np.array(ann_name)}
        if self.ann is not None:
            arrays["labels"], arrays["next_label"] = self.ann.labels, np.array(self.ann.next_label)
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)

    @staticmethod
    def stored_key(path: Path) -> tuple[str, str]:
        """(the key the stored state was saved for, the name of its HNSW file or '')."""
        with np.load(path, allow_pickle=False) as z:
            return str(z["key"]), str(z["ann"])

    @classmethod
    def load(cls, path: Path, ann_file: Path | None, dim: int) -> Neighbours:
        with np.load(path, allow_pickle=False) as z:
            rows, sims = z["rows"], z["sims"]
            ann = HNSW.load(ann_file, z["labels"], int(z["next_label"]), dim) if ann_file is not None and "labels" in z else None
        return cls(rows, sims, ann)
