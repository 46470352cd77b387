"""A PostgreSQL index above its ANN threshold keeps its HNSW index as a file row written now and then,
with a change log in between (tether.rag._pg_ann): a one-file change writes a log row, not the file;
another process replays the log and finds what the change added; the file is written again once the
log holds more than LOG_LIMIT additions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("hnswlib")

from rag_fakes import BagEmbedder
from store_fixtures import fresh_postgres_database
from test_rag_postgres_rows import QUERIES, SETTINGS, corpus

from tether.rag import _neighbours
from tether.rag._index import Index

THRESHOLD = 20  # (the corpus has about 150 passages: its HNSW index is used)

READER = """
import json, sys
sys.path.insert(0, sys.argv[2])
from rag_fakes import BagEmbedder
from tether.rag._index import Index
idx = Index.open(sys.argv[1], embedder=BagEmbedder(), ann_threshold=int(sys.argv[3]))
for line in sys.stdin:
    query = line.strip()
    hits = idx.search(query, 5)
    dense = idx._retriever.dense
    print(json.dumps({"ids": [h.id for h in hits], "dense": [idx._rows[p].id for p, _ in dense.search(query, 3)],
                      "ann": dense.ivf is not None}), flush=True)
"""


@pytest.fixture
def pg_url() -> Iterator[str]:
    pytest.importorskip("psycopg")
    yield from fresh_postgres_database()


class Reader:
    """Another process searching the index, a line per query."""

    def __init__(self, url: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                             os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-c", READER, url, str(Path(__file__).parent), str(THRESHOLD)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, query: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(query + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def stored(idx: Index) -> tuple[dict[str, str], int]:
    """(the files rows: name -> the transaction that wrote them, how many log rows there are)."""
    files = dict(idx._db.execute("SELECT name, xmin::text FROM files").fetchall())
    return files, int(idx._db.execute("SELECT count(*) FROM ann_log").fetchone()[0])


def test_a_one_file_change_writes_a_log_row_that_another_process_replays(tmp_path: Path, pg_url: str) -> None:
    docs = corpus(tmp_path)
    url = pg_url + "#annlog"
    with Index.open(url, retriever="best", embedder=BagEmbedder(), ann_threshold=THRESHOLD, **SETTINGS) as writer:
        writer.ingest(docs)
        writer.search(QUERIES[0], 5)  # builds the HNSW index and writes its file
        reader = Reader(url)
        try:
            query = "zebra quokka narwhal"  # no passage has these words yet
            assert reader.ask(query)["ann"]  # the reader searches through the HNSW index (read from the file)
            files, logged = stored(writer)
            assert [n for n in files if n.startswith("ann-")] and logged == 0
            writer.add_text("animals", query)
            new_id = writer.search(query, 1)[0].id
            after, logged = stored(writer)
            assert after == files  # the HNSW file was not written again
            assert logged == 1  # the change is one log row
            seen = reader.ask(query)
            assert seen["ids"][0] == new_id
            assert seen["dense"][0] == new_id  # its vector is in the reader's HNSW index: the log was replayed
            for q in QUERIES:  # the replayed graph is the writer's
                assert reader.ask(q)["ids"] == [h.id for h in writer.search(q, 5)], q
        finally:
            reader.close()


def test_the_file_is_written_again_once_the_log_is_long(tmp_path: Path, pg_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_neighbours, "LOG_LIMIT", 3)  # (a reader in another process only replays)
    docs = corpus(tmp_path)
    url = pg_url + "#rebase"
    with Index.open(url, retriever="best", embedder=BagEmbedder(), ann_threshold=THRESHOLD, **SETTINGS) as writer:
        writer.ingest(docs)
        writer.search(QUERIES[0], 5)
        reader = Reader(url)
        try:
            reader.ask(QUERIES[0])
            files, _ = stored(writer)
            writer.add_text("a", "zebra quokka")  # 1 addition: logged
            writer.search(QUERIES[0], 5)
            assert stored(writer) == (files, 1)
            writer.add_texts([("b", "narwhal okapi"), ("c", "axolotl tapir"), ("d", "pangolin quokka")])
            writer.search(QUERIES[0], 5)  # 4 additions since the file: written again, the log emptied
            now, logged = stored(writer)
            assert logged == 0 and len(now) == len(files) and now.keys() != files.keys()
            writer.add_text("e", "okapi zebra tapir")
            for q in [*QUERIES, "zebra quokka", "pangolin quokka", "okapi zebra tapir"]:
                assert reader.ask(q)["ids"] == [h.id for h in writer.search(q, 5)], q
        finally:
            reader.close()
