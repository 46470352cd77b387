"""The HNSW index of a PostgreSQL index above its ANN threshold: one file row plus a change log.

The file (a `files` row named `ann-GEN-STAMP.hnsw`, STAMP making each written file's name its own)
is written whole only when the neighbour state says so (`Neighbours.rebase_due`: no file yet, a
compaction, or more than LOG_LIMIT additions logged since). In between, each change adds one
`ann_log` row: the labels it marked deleted, the labels it added and their vectors (as hnswlib holds
them), a few kilobytes for a one-file change. A process replays the rows after the file (or after the
last row it replayed, when it already holds that file's index) in order, as the SQLite index replays
its log: the same operations from the same file give every process the writer's graph.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tether.rag._neighbours import HNSW

SCHEMA = """
CREATE TABLE IF NOT EXISTS ann_log (seq BIGINT PRIMARY KEY, base TEXT NOT NULL, deleted BYTEA NOT NULL,
    labels BYTEA NOT NULL, vectors BYTEA NOT NULL)
"""

Entry = tuple[np.ndarray, np.ndarray, np.ndarray]  # a Neighbours log entry: (deleted labels, added slots, their labels)


class Held(NamedTuple):
    """The HNSW index a process holds: the file it was read from, the last log row replayed, and
    the log since the file (as `Neighbours.log`: what `rebase_due` counts)."""

    base: str
    seq: int
    ann: HNSW
    log: list[Entry]


def write_entries(conn: Any, base: str, ann: HNSW, entries: list[Entry]) -> int:
    """Add `entries` (the last ones of a state's log) as rows after `base`'s; the last seq (0: none)."""
    seq = 0
    for deleted, _, labels in entries:
        seq = int(conn.execute("SELECT nextval('row_stamps')").fetchone()[0])
        vectors = np.asarray(ann.index.get_items(labels.tolist()), dtype=np.float32) if len(labels) else \
            np.zeros((0, 0), dtype=np.float32)
        conn.execute("INSERT INTO ann_log (seq, base, deleted, labels, vectors) VALUES (%s, %s, %s, %s, %s)",
                     (seq, base, np.asarray(deleted, dtype=np.int64).tobytes(),
                      np.asarray(labels, dtype=np.int64).tobytes(), vectors.tobytes()))
    return seq


def logged(conn: Any, base: str) -> int:
    """How many log rows follow the file `base`."""
    return int(conn.execute("SELECT count(*) FROM ann_log WHERE base = %s", (base,)).fetchone()[0])


def replay(conn: Any, held: Held, upto: int, dim: int) -> Held:
    """`held` carried to the log row `upto`: the rows after `held.seq` replayed in order."""
    rows = conn.execute("SELECT seq, deleted, labels, vectors FROM ann_log WHERE base = %s AND seq > %s "
                        "AND seq <= %s ORDER BY seq", (held.base, held.seq, upto), binary=True).fetchall()
    log = list(held.log)
    for _, deleted, labels, vectors in rows:
        dead = np.frombuffer(deleted, dtype=np.int64)
        added = np.frombuffer(labels, dtype=np.int64)
        held.ann.replay(dead, np.frombuffer(vectors, dtype=np.float32).reshape(len(added), dim), added)
        log.append((dead, added, added))  # (slots stand in by count only: `rebase_due` sums their lengths)
    return Held(held.base, max(held.seq, upto), held.ann, log)
