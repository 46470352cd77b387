"""A PostgreSQL index keeps vectors, windows and neighbours as rows (tether.rag._pg_rows): it ranks as
the SQLite index of the same files, a process reads a generation once and then only the rows of
newer ones, another process sees a change, and a one-file change writes only that file's rows."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hang import HANG

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from rag_fakes import BagEmbedder
from store_fixtures import fresh_postgres_database

from tether.rag import _pg_rows
from tether.rag._index import Index

WORDS = [f"{a}{b}" for a in ("ref", "ship", "pass", "inv", "ware", "parc", "gift", "acc", "tax", "loy")
         for b in ("und", "ping", "word", "oice", "house", "el", "card", "ount", "rate", "alty", "ing", "ed")]
QUERIES = ["refund shipping", "password invoice warehouse", "parcel giftcard", "account taxrate loyalty",
           "refed shipund password", "warehouse"]
# The stated tolerance: the same top 10 in the same order, every score within 1e-4 of SQLite's.
TOLERANCE = 1e-4
SETTINGS: dict[str, Any] = {"chunk_tokens": 30, "overlap": 5, "window": 8, "stride": 4}


@pytest.fixture
def pg_url() -> Iterator[str]:
    pytest.importorskip("psycopg")
    yield from fresh_postgres_database()


def write_file(path: Path, rng: random.Random) -> None:
    path.write_text("\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))
                                for _ in range(rng.randint(1, 4))) + "\n")


def corpus(root: Path, files: int = 40) -> Path:
    rng = random.Random(7)
    docs = root / "docs"
    docs.mkdir()
    for i in range(files):
        write_file(docs / f"f{i:02d}.txt", rng)
    return docs


def change_files(docs: Path) -> None:
    """One file rewritten, one deleted, one added."""
    rng = random.Random(11)
    write_file(docs / "f03.txt", rng)
    (docs / "f05.txt").unlink()
    write_file(docs / "new.txt", rng)


def top(idx: Index, query: str) -> list[tuple[str, float]]:
    return [(h.id, h.score) for h in idx.search(query, 10)]


def assert_same_ranking(pg: Index, lite: Index) -> None:
    for q in QUERIES:
        a, b = top(pg, q), top(lite, q)
        assert [i for i, _ in a] == [i for i, _ in b], q
        assert all(abs(x - y) <= TOLERANCE for (_, x), (_, y) in zip(a, b, strict=True)), (q, a, b)


@pytest.mark.parametrize("retriever", ["bm25", "hybrid", "best"])
def test_postgres_ranks_the_same_files_as_sqlite(tmp_path: Path, pg_url: str, retriever: str) -> None:
    docs = corpus(tmp_path)
    with Index(tmp_path / "ix", retriever=retriever, embedder=BagEmbedder(), **SETTINGS) as lite, \
            Index.open(pg_url + "#rank", retriever=retriever, embedder=BagEmbedder(), **SETTINGS) as pg:
        for idx in (lite, pg):
            idx.ingest(docs)
        assert len(pg) == len(lite) > 100  # above `best`'s min_store: the neighbour graph is used
        assert_same_ranking(pg, lite)
        change_files(docs)
        for idx in (lite, pg):
            idx.ingest(docs)
        assert_same_ranking(pg, lite)



@pytest.mark.parametrize("ann_threshold", [50_000, 20])
def test_postgres_ranks_as_sqlite_through_removals_and_a_compaction(tmp_path: Path, pg_url: str,
                                                                     ann_threshold: int) -> None:
    """Removed files leave dead slots (their vectors reused where a rewritten file keeps a passage's
    text), then a quarter dead compacts both stores; 20: with an HNSW index, kept as a file."""
    docs = corpus(tmp_path)
    rng = random.Random(13)
    with Index(tmp_path / "ix", retriever="best", embedder=BagEmbedder(), ann_threshold=ann_threshold,
               **SETTINGS) as lite, \
            Index.open(pg_url + "#compact", retriever="best", embedder=BagEmbedder(), ann_threshold=ann_threshold,
                       **SETTINGS) as pg:
        for idx in (lite, pg):
            idx.ingest(docs)
        for round_ in range(3):
            for i in range(round_ * 5, round_ * 5 + 5):
                (docs / f"f{i:02d}.txt").unlink()
            moved = docs / "moved.md"  # a section put first: the others' passages move, their vectors are reused
            moved.write_text(f"# s{round_}\n\n" + " ".join(rng.choice(WORDS) for _ in range(20)) + "\n\n"
                             + (moved.read_text() if moved.exists() else ""))
            for idx in (lite, pg):
                idx.ingest(docs)
            assert_same_ranking(pg, lite)
        compacted = pg._meta("compacted")
        assert compacted is not None and lite._meta("compacted") == compacted
        live = {r[0] for r in pg._db.execute("SELECT id FROM chunks").fetchall()}
        assert {r[0] for r in pg._db.execute("SELECT id FROM chunk_vectors").fetchall()} == live
        assert {r[0] for r in pg._db.execute("SELECT id FROM chunk_graph").fetchall()} == live
        _fresh_process_cache()
        with Index.open(pg_url + "#compact", embedder=BagEmbedder(), ann_threshold=ann_threshold) as reader:
            assert_same_ranking(reader, lite)

def _fresh_process_cache() -> None:
    _pg_rows._CACHES.clear()  # as a new process would start


def test_a_process_reads_a_generation_once_then_only_newer_rows(tmp_path: Path, pg_url: str) -> None:
    docs = corpus(tmp_path)
    url = pg_url + "#cache"
    with Index.open(url, retriever="best", embedder=BagEmbedder(), **SETTINGS) as writer:
        writer.ingest(docs)
        writer.search(QUERIES[0], 5)  # (builds and stores the neighbour graph)
        n = len(writer)
        _fresh_process_cache()
        reader = Index.open(url, embedder=BagEmbedder())
        reader.search(QUERIES[0], 5)
        cache = reader._rowcache  # type: ignore[attr-defined]
        first = dict(cache.downloaded)
        assert first["vectors"] == first["chunks"] == first["graph"] == n and first["orders"] == 1
        for q in QUERIES:  # the same generation: nothing more is read, by this object or another one
            reader.search(q, 5)
        with Index.open(url, embedder=BagEmbedder()) as again:
            again.search(QUERIES[1], 5)
        assert cache.downloaded == first
        before = {r[0] for r in writer._db.execute("SELECT id FROM chunks").fetchall()}
        rng = random.Random(3)
        write_file(docs / "f07.txt", rng)
        writer.ingest(docs / "f07.txt")  # another Index (a process of its own, for the cache) changes one file
        new = {r[0] for r in writer._db.execute("SELECT id FROM chunks").fetchall()} - before
        assert new
        hits = reader.search(" ".join((docs / "f07.txt").read_text().split()[:6]), 5)
        assert hits[0].id in new
        after = cache.downloaded
        assert after["vectors"] - first["vectors"] == after["chunks"] - first["chunks"] == len(new)
        assert after["orders"] == first["orders"] + 1
        assert 0 < after["graph"] - first["graph"] < n // 2  # the neighbour rows that changed
        reader.close()


def test_a_one_file_change_writes_only_that_files_vector_rows(tmp_path: Path, pg_url: str) -> None:
    docs = corpus(tmp_path)
    with Index.open(pg_url + "#one", retriever="best", embedder=BagEmbedder(), **SETTINGS) as idx:
        idx.ingest(docs)
        idx.search(QUERIES[0], 5)
        rows = dict(idx._db.execute("SELECT id, xmin::text FROM chunk_vectors").fetchall())
        graph = dict(idx._db.execute("SELECT id, xmin::text FROM chunk_graph").fetchall())
        assert len(rows) == len(graph) == len(idx)
        rng = random.Random(5)
        write_file(docs / "f12.txt", rng)
        idx.ingest(docs / "f12.txt")
        idx.search(QUERIES[0], 5)
        mine = {r[0] for r in idx._db.execute("SELECT id FROM chunks WHERE source LIKE '%%/f12.txt'").fetchall()}
        now = dict(idx._db.execute("SELECT id, xmin::text FROM chunk_vectors").fetchall())
        assert now.keys() == {r[0] for r in idx._db.execute("SELECT id FROM chunks").fetchall()}
        assert {i for i, x in now.items() if rows.get(i) != x} == mine  # written: this file's rows only
        regraphed = {i for i, x in idx._db.execute("SELECT id, xmin::text FROM chunk_graph").fetchall()
                     if graph.get(i) != x}
        assert mine <= regraphed and len(regraphed) < len(now) // 2
        assert not idx._db.execute("SELECT name FROM files").fetchall()  # no arrays stored whole


def test_a_one_file_change_lays_out_only_its_own_vectors(tmp_path: Path, pg_url: str) -> None:
    """The change and the search after it add the file's slots to the process's arrays per slot,
    not the whole store's, and format only the neighbour rows the change touched; they rank as a
    process that lays out the store anew, and as SQLite."""
    docs = corpus(tmp_path)
    url = pg_url + "#laid"
    with Index(tmp_path / "ix", retriever="best", embedder=BagEmbedder(), **SETTINGS) as lite, \
            Index.open(url, retriever="best", embedder=BagEmbedder(), **SETTINGS) as idx:
        for ix in (lite, idx):
            ix.ingest(docs)
            ix.search(QUERIES[0], 5)
        cache = idx._rowcache  # type: ignore[attr-defined]
        before, made = cache.laid_slots, cache.graph_rows_made
        assert cache.laid is not None and cache.laid.n >= len(idx)
        old = {r[0] for r in idx._db.execute("SELECT id FROM chunks").fetchall()}
        write_file(docs / "f12.txt", random.Random(5))
        for ix in (lite, idx):
            ix.ingest(docs / "f12.txt")
        idx.search(QUERIES[1], 5)
        new = {r[0] for r in idx._db.execute("SELECT id FROM chunks").fetchall()} - old
        assert new and cache.laid_slots - before == len(new)  # the change's slots, laid out once
        assert len(new) <= cache.graph_rows_made - made < len(idx) // 2  # the rows `update` changed
        assert_same_ranking(idx, lite)
        _fresh_process_cache()
        with Index.open(url, embedder=BagEmbedder()) as reader:
            assert_same_ranking(reader, lite)
            assert reader._rowcache.laid_slots == len(reader)  # laid out anew: every live passage once  # type: ignore[attr-defined]


def held_vectors(cache: Any) -> int:
    """Vectors the process's cache holds: those laid out per slot and those kept by id beside them."""
    laid = sum(c is not None for c in cache.laid.ids[: cache.laid.n]) if cache.laid is not None else 0
    return laid + (cache.pool.n if cache.pool is not None else 0)


def test_the_cache_holds_each_vector_once(tmp_path: Path, pg_url: str) -> None:
    """The ingesting process and a reader keep each passage's vector (and windows) once: laid out
    per slot, with no second copy by id; a change adds only its own."""
    docs = corpus(tmp_path)
    url = pg_url + "#once"
    with Index.open(url, retriever="best", embedder=BagEmbedder(), **SETTINGS) as idx:
        idx.ingest(docs)
        idx.search(QUERIES[0], 5)
        cache = idx._rowcache  # type: ignore[attr-defined]
        n = len(idx)
        assert cache.laid is not None and held_vectors(cache) == n
        # the whole ingest laid its arrays out: its first search lays out and reads no vector
        assert cache.laid_slots == 0 and cache.downloaded["vectors"] == 0
        assert cache.pool is None or cache.pool.n == 0
        old = {r[0] for r in idx._db.execute("SELECT id FROM chunks").fetchall()}
        write_file(docs / "f12.txt", random.Random(5))
        idx.ingest(docs / "f12.txt")
        idx.search(QUERIES[1], 5)
        now = {r[0] for r in idx._db.execute("SELECT id FROM chunks").fetchall()}
        removed, added = old - now, now - old
        assert removed and held_vectors(cache) == n + len(added)  # (removed ones stay in their dead slots)
        assert cache.pool is None or cache.pool.n == 0
        _fresh_process_cache()
        with Index.open(url, embedder=BagEmbedder()) as reader:
            reader.search(QUERIES[2], 5)
            fresh = reader._rowcache  # type: ignore[attr-defined]
            assert held_vectors(fresh) == len(reader)
            assert fresh.pool is None or fresh.pool.n == 0


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[2])
from rag_fakes import BagEmbedder
from tether.rag._index import Index
idx = Index.open(sys.argv[1], embedder=BagEmbedder())
for line in sys.stdin:
    hits = idx.search(line.strip(), 3)
    print(json.dumps({"ids": [h.id for h in hits], "downloaded": idx._rowcache.downloaded}), flush=True)
"""


def test_a_second_process_sees_a_change(tmp_path: Path, pg_url: str) -> None:
    docs = corpus(tmp_path)
    url = pg_url + "#two"
    with Index.open(url, retriever="best", embedder=BagEmbedder(), **SETTINGS) as writer:
        writer.ingest(docs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(Path(__file__).parent)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdin is not None and child.stdout is not None

    def ask(query: str) -> dict[str, Any]:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(query + "\n")
        child.stdin.flush()
        return json.loads(child.stdout.readline())

    try:
        query = "zebra quokka narwhal"  # no passage has these words yet
        first = ask(query)
        assert first["downloaded"]["vectors"] > 100
        with Index.open(url, embedder=BagEmbedder()) as writer:
            writer.add_text("animals", "zebra quokka narwhal")
            new_id = writer.search(query, 1)[0].id
        second = ask(query)
        assert second["ids"][0] == new_id
        assert second["downloaded"]["vectors"] == first["downloaded"]["vectors"] + 1  # the new passage only
    finally:
        child.stdin.close()
        child.wait(HANG)


class Counting:
    """A psycopg connection that counts the statements sent through it."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.statements = conn, 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return self.conn.execute(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


@pytest.mark.parametrize("retriever", ["bm25", "best"])
def test_a_search_of_a_read_generation_is_one_statement(tmp_path: Path, pg_url: str, retriever: str) -> None:
    docs = corpus(tmp_path)
    with Index.open(pg_url + "#trips", retriever=retriever, embedder=BagEmbedder(), **SETTINGS) as idx:
        idx.ingest(docs)
        counting = Counting(idx._db.conn)
        idx._db.conn = counting  # pyright: ignore[reportAttributeAccessIssue]
        idx.search(QUERIES[0], 5)  # reads the generation
        for q in QUERIES[1:]:
            before = counting.statements
            assert idx.search(q, 5)
            assert counting.statements - before == 1, q


def test_an_index_with_its_vectors_in_files_is_searched_without_embedding_again(tmp_path: Path, pg_url: str) -> None:
    """An index written before vectors were rows: its arrays serve until its next change writes them as rows."""
    docs = corpus(tmp_path)
    url = pg_url + "#old"
    with Index.open(url, retriever="best", embedder=BagEmbedder(), **SETTINGS) as idx:
        idx.ingest(docs)
        stored = idx._load_vectors(len(idx))
        assert stored is not None
        with idx._db:  # as the last commit kept them: arrays in `files`, no vector rows
            Index._switch_vectors(idx, Index._write_arrays(idx, stored), stored, idx._meta("generation") or "0")
            idx._db.execute("DELETE FROM chunk_vectors")
    _fresh_process_cache()
    embedder = BagEmbedder()
    with Index.open(url, embedder=embedder) as idx:
        assert idx.search(QUERIES[0], 5)
        assert embedder.texts == 1  # the query only: no passage embedded again
        rng = random.Random(9)
        write_file(docs / "f20.txt", rng)
        idx.ingest(docs / "f20.txt")
        assert idx._db.execute("SELECT count(*) FROM chunk_vectors").fetchone()[0] == len(idx)
        assert not idx._db.execute("SELECT name FROM files").fetchall()
