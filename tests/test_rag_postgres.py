"""An index in PostgreSQL (tether.rag._pg_index): real processes through the CLI against a real
server ($TETHER_TEST_POSTGRES, started by .ci/run), compared with a SQLite index of the same files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hang import HANG

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")
pytest.importorskip("onnxruntime")

from rag_fakes import BagEmbedder
from store_fixtures import fresh_postgres_database
from test_rag_robustness import Gate, run, tether

from tether.rag._index import Index


@pytest.fixture
def pg_url() -> Iterator[str]:
    pytest.importorskip("psycopg")
    yield from fresh_postgres_database()


def folder(root: Path, name: str, files: int) -> Path:
    d = root / name
    d.mkdir(parents=True)
    topics = ["refunds and returns", "shipping to Norway", "password resets", "invoices in euros",
              "warehouse opening hours", "damaged parcels", "gift cards", "account deletion"]
    for i in range(files):
        topic = topics[(i + len(name)) % len(topics)]
        (d / f"{name}{i}.md").write_text(f"# {name} {i}: {topic}\n" + f"How {topic} work for {name} customers, "
                                         f"case {i}. " * (5 + 7 * i))
    return d


def scores(home: Path, index: str, query: str) -> dict[str, float]:
    r = run(home, "search", query, "--index", index, "-k", "20", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["retriever"] == "best" and out["note"] is None
    return {f'{Path(h["source"]).name}#{h["id"]}': h["score"] for h in out["hits"]}


def _after_encoder_line(stream: Any) -> str:
    """Stderr from the line that says the ingest waits (the encoder's lines before it skipped)."""
    for _ in range(10):
        line = stream.readline()
        if "waiting" in line or not line:
            return line
    return ""


def test_two_processes_ingest_into_postgres_and_a_third_searches_as_sqlite_would(tmp_path: Path, pg_url: str) -> None:
    docs = tmp_path / "docs"
    a, b = folder(docs, "alpha", 8), folder(docs, "beta", 8)
    index = pg_url + "#kb"
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as holder:  # this test is a third writer, for a while
        holder.execute("SELECT pg_advisory_lock(hashtext('tether-index:tether_index_kb:write.lock'))")
        procs = [tether(tmp_path / "home", "ingest", str(d), "--index", index) for d in (a, b)]
        waiting = [" ".join((_after_encoder_line(p.stderr) + p.stderr.readline()).split()) for p in procs if p.stderr]
        assert all("waiting for another process writing to the index at 127.0.0.1" in w for w in waiting), waiting
        assert all("postgresql://" not in w for w in waiting)  # the location, without scheme and user
        assert [p.poll() for p in procs] == [None, None]
    outs = [p.communicate(timeout=HANG) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for d in (a, b):  # the second ingest of each folder finds it unchanged
        again = run(tmp_path / "home", "ingest", str(d), "--index", index)
        assert again.returncode == 0 and again.stdout.startswith("0 added, 0 updated, 0 deleted, 8 unchanged"), again
    # the same files in a SQLite index
    for d in (a, b):
        assert run(tmp_path / "home", "ingest", str(d), "--index", "local").returncode == 0
    for query in ("how do refunds work", "parcels to Norway", "case 3 for beta customers", "gift cards"):
        in_pg, in_sqlite = scores(tmp_path / "home", index, query), scores(tmp_path / "home", "local", query)
        assert in_pg.keys() == in_sqlite.keys(), query
        assert all(abs(in_pg[k] - in_sqlite[k]) < 1e-4 for k in in_pg), (query, in_pg, in_sqlite)


def test_a_search_during_an_ingest_is_answered_by_bm25_and_says_so(tmp_path: Path, pg_url: str) -> None:
    import threading

    texts = [(f"doc{i}", f"passage {i} about topic{i % 7} and more words") for i in range(300)]
    gate = Gate(3)
    writer = Index.open(pg_url + "#kb", embedder=gate)
    ingest = threading.Thread(target=writer.add_texts, args=(texts,))
    ingest.start()
    try:
        assert gate.reached.wait(HANG)
        reader = Index.open(pg_url + "#kb", embedder=BagEmbedder())
        hits = reader.search("topic3", k=3)
        assert len(hits) == 3 and all(h.text.endswith("topic3 and more words") for h in hits)
        assert reader.answered_by == "bm25" and "(128 of 300 passages)" in (reader.vectors_pending or "")
    finally:
        gate.release.set()
        ingest.join(HANG)
    writer.close()
    assert reader.search("topic3", k=3) and reader.answered_by == "best" and reader.vectors_pending is None
    reader.close()


def test_a_failed_first_ingest_leaves_no_schema_and_a_bad_url_is_one_line(tmp_path: Path, pg_url: str) -> None:
    import psycopg

    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(tmp_path / "home", "ingest", str(empty), "--index", pg_url + "#bad")
    assert r.returncode == 2 and "no files to ingest" in " ".join(r.stderr.split()), r
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = 'tether_index_bad'"
                            ).fetchone() is None
    r = run(tmp_path / "home", "search", "x", "--index", pg_url + "#bad")
    assert r.returncode == 2 and "no index at" in r.stderr
    r = run(tmp_path / "home", "search", "x", "--index", pg_url + "#Bad-Name")
    assert r.returncode == 2 and "index name 'Bad-Name'" in " ".join(r.stderr.split())
    r = run(tmp_path / "home", "search", "x", "--index", "postgresql://nobody@127.0.0.1:9/none#kb")
    assert r.returncode == 1 and r.stderr.startswith("tether: PostgreSQL:") and "Traceback" not in r.stderr, r
