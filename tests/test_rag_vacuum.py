"""A SQLite index gives the pages freed by its embedding checkpoints back to the file system (made
with incremental auto-vacuum); an index made before that keeps working."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("bm25s")

from rag_fakes import BagEmbedder
from test_rag_postgres_rows import SETTINGS, corpus, write_file

from tether.rag._index import Index


def checkpoints(idx: Index, n: int) -> None:
    """`n` embedding checkpoints (1.5 KB each), as a stopped ingest leaves them."""
    with idx._db:
        idx._db.executemany("INSERT INTO embed_cache(key, vec) VALUES (?, ?)",
                            [(os.urandom(16), os.urandom(1536)) for _ in range(n)])


def test_the_pages_of_deleted_checkpoints_leave_the_file(tmp_path: Path) -> None:
    docs = corpus(tmp_path)
    db = tmp_path / "ix" / "index.sqlite"
    with Index(tmp_path / "ix", retriever="hybrid", embedder=BagEmbedder(), **SETTINGS) as idx:
        idx.ingest(docs)
        checkpoints(idx, 2000)
        before = db.stat().st_size
        write_file(docs / "f04.txt", random.Random(4))
        idx.ingest(docs / "f04.txt")  # the change's vectors stored: every checkpoint deleted
        assert idx._db.execute("SELECT count(*) FROM embed_cache").fetchone()[0] == 0
        assert db.stat().st_size < before - 2_000_000  # the 3 MB of checkpoints went
        assert idx._db.execute("PRAGMA freelist_count").fetchone()[0] == 0
        assert idx.search("refund shipping", 3)


def test_an_index_made_without_auto_vacuum_keeps_working(tmp_path: Path) -> None:
    docs = corpus(tmp_path)
    (tmp_path / "ix").mkdir()
    sqlite3.connect(tmp_path / "ix" / "index.sqlite").execute("CREATE TABLE old (x)").connection.close()
    with Index(tmp_path / "ix", retriever="hybrid", embedder=BagEmbedder(), **SETTINGS) as idx:
        assert idx._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        idx.ingest(docs)
        checkpoints(idx, 200)
        write_file(docs / "f04.txt", random.Random(4))
        idx.ingest(docs / "f04.txt")
        assert idx._db.execute("PRAGMA freelist_count").fetchone()[0] > 0  # kept for reuse
        assert idx.search("refund shipping", 3)
