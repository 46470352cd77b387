"""BM25 computed by PostgreSQL (tether.rag._pg_lexical): it ranks as the SQLite index ranks, follows
each change, and leaves no lexical state to download."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")
pytest.importorskip("hnswlib")

from store_fixtures import fresh_postgres_database
from test_rag_ann import TEXTS, RandomEmbedder, change

from tether.rag._index import Index

QUERIES = ["topic1", "passage about theme2", "topic9 rewritten", "new passage", "nothing matches zebra"]


@pytest.fixture
def pg_url() -> Iterator[str]:
    pytest.importorskip("psycopg")
    yield from fresh_postgres_database()


def ranked(idx: Index, query: str) -> list[tuple[str, float]]:
    return [(h.id, round(h.score, 4)) for h in idx.search(query, 20)]


@pytest.mark.parametrize("retriever", ["bm25", "best"])
def test_postgres_ranks_on_the_server_as_sqlite_ranks(tmp_path: Path, pg_url: str, retriever: str) -> None:
    with Index(tmp_path / "ix", retriever=retriever, embedder=RandomEmbedder()) as lite, \
            Index.open(pg_url + "#lex", retriever=retriever, embedder=RandomEmbedder()) as pg:
        for idx in (lite, pg):
            idx.add_texts(TEXTS)
        for q in QUERIES:
            assert ranked(pg, q) == ranked(lite, q), q
        for idx in (lite, pg):
            change(idx)  # a rewritten, a removed and two new passages: the server's terms follow
        for q in QUERIES:
            assert ranked(pg, q) == ranked(lite, q), q
        names = [r[0] for r in pg._db.execute("SELECT name FROM files").fetchall()]
        assert not [n for n in names if n.startswith("lexical-")]  # no BM25 state to download


def test_an_index_without_server_terms_gets_them_once(tmp_path: Path, pg_url: str) -> None:
    """An index written before the server kept terms: its first search writes them for every passage."""
    with Index(tmp_path / "ix", retriever="bm25") as lite, Index.open(pg_url + "#old", retriever="bm25") as pg:
        for idx in (lite, pg):
            idx.add_texts(TEXTS)
        with pg._db:
            for table in ("postings", "docterms", "termdf"):
                pg._db.execute(f"DELETE FROM {table}")
            pg._db.execute("DELETE FROM meta WHERE key = 'postings'")
    with Index.open(pg_url + "#old") as pg, Index(tmp_path / "ix") as lite:
        for q in QUERIES:
            assert ranked(pg, q) == ranked(lite, q), q
        assert pg._db.execute("SELECT count(DISTINCT id) FROM docterms").fetchone()[0] == len(TEXTS)


def test_a_large_first_load_builds_the_key_after_it(tmp_path: Path, pg_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.rag import _pg_lexical

    monkeypatch.setattr(_pg_lexical, "BULK", 1)  # every load into an empty table is a bulk load
    with Index(tmp_path / "ix", retriever="bm25") as lite, Index.open(pg_url + "#bulk", retriever="bm25") as pg:
        for idx in (lite, pg):
            idx.add_texts(TEXTS)
            change(idx)  # later changes go into a table that has rows: the key is kept up
        for q in QUERIES:
            assert ranked(pg, q) == ranked(lite, q), q
        keys = pg._db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'postings_pkey' "
                              "AND schemaname = 'tether_index_bulk'").fetchall()
        assert keys and "(term, id)" in keys[0][0]
