"""The persistent index: incremental ingest (add, update, delete), persistence round trip."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from rag_fakes import BagEmbedder, stored_array

from tether.rag._index import Index, default_root, index_path
from tether.rag._neighbours import HNSW


@pytest.fixture
def docs(tmp_path):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "refunds.md").write_text("# Refunds\nRefunds are issued within 30 days of delivery.\n")
    (d / "shipping.txt").write_text("Parcels ship to Norway and the UK within three days.\n")
    (d / "sub" / "cards.html").write_text("<h1>Gift cards</h1><p>Gift cards never expire.</p>")
    (d / "notes.bin").write_bytes(b"\0")  # unsupported: ignored in a folder
    (d / ".hidden").mkdir()
    (d / ".hidden" / "secret.md").write_text("hidden")
    return d


def ids_by_source(idx: Index) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in idx.chunks():
        out.setdefault(c.source.rsplit("/", 1)[-1], []).append(c.id)
    return out


def test_ingest_then_reingest_unchanged_does_nothing(tmp_path, docs):
    emb = BagEmbedder()
    idx = Index(tmp_path / "ix", embedder=emb)
    r1 = idx.ingest(docs)
    assert len(r1.added) == 3 and r1.chunks_added == 3 and not r1.skipped
    assert sorted(s.rsplit("/", 1)[-1] for s in idx.sources()) == ["cards.html", "refunds.md", "shipping.txt"]
    before = ids_by_source(idx)
    embedded = emb.texts
    r2 = idx.ingest(docs)
    assert not r2.changed and len(r2.unchanged) == 3
    assert ids_by_source(idx) == before and emb.texts == embedded


def test_update_replaces_only_that_source_and_embeds_only_new_chunks(tmp_path, docs):
    emb = BagEmbedder()
    idx = Index(tmp_path / "ix", embedder=emb)
    idx.ingest(docs)
    before = ids_by_source(idx)
    embedded = emb.texts
    (docs / "shipping.txt").write_text("Parcels ship to Switzerland within five days.\n")
    r = idx.ingest(docs)
    assert [s.rsplit("/", 1)[-1] for s in r.updated] == ["shipping.txt"] and r.chunks_added == 1
    after = ids_by_source(idx)
    assert after["refunds.md"] == before["refunds.md"] and after["cards.html"] == before["cards.html"]
    assert after["shipping.txt"] != before["shipping.txt"]
    assert emb.texts == embedded + 1
    # (the hashed-bag test embedder weighs too much in `best` for a one-word query to rank first)
    assert any(h.source.endswith("shipping.txt") and "Switzerland" in h.text for h in idx.search("Switzerland", 3))
    assert not any("Norway" in h.text for h in idx.search("Norway", 3))


def test_files_gone_from_an_ingested_folder_are_deleted(tmp_path, docs):
    idx = Index(tmp_path / "ix", embedder=BagEmbedder())
    idx.ingest(docs)
    (docs / "sub" / "cards.html").unlink()
    r = idx.ingest(docs)
    assert [s.rsplit("/", 1)[-1] for s in r.deleted] == ["cards.html"] and r.chunks_removed == 1
    assert len(idx) == 2 and all("Gift" not in h.text for h in idx.search("gift cards", 5))
    vectors = stored_array(tmp_path / "ix", "vectors")
    assert vectors.shape == (2, 64)  # compacted (a third of the slots dead): no rows left for deleted chunks


def test_ingesting_one_file_does_not_delete_its_siblings(tmp_path, docs):
    idx = Index(tmp_path / "ix", embedder=BagEmbedder())
    idx.ingest(docs)
    idx.ingest(docs / "refunds.md")
    assert len(idx.sources()) == 3


def test_remove_and_add_text(tmp_path, docs):
    idx = Index(tmp_path / "ix", retriever="bm25")
    idx.ingest(docs)
    assert idx.remove(docs / "refunds.md").deleted
    assert not idx.remove(docs / "refunds.md").deleted  # already gone
    idx.add_text("faq", "# Opening hours\nWe are open on weekdays.")
    hit = idx.search("open weekdays", 1)[0]
    assert (hit.source, hit.heading) == ("faq", "Opening hours")
    assert not idx.add_text("faq", "# Opening hours\nWe are open on weekdays.").changed


def test_persistence_round_trip_without_re_embedding(tmp_path, docs):
    emb = BagEmbedder()
    with Index(tmp_path / "ix", embedder=emb) as idx:
        idx.ingest(docs)
        first = [(h.id, h.score) for h in idx.search("refunds within 30 days", 3)]
    embedded = emb.texts
    reopened_emb = BagEmbedder()
    with Index(tmp_path / "ix", embedder=reopened_emb) as idx:
        assert idx.retriever_name == "best" and len(idx) == 3
        again = [(h.id, h.score) for h in idx.search("refunds within 30 days", 3)]
    assert [i for i, _ in again] == [i for i, _ in first]
    assert [s for _, s in again] == pytest.approx([s for _, s in first], abs=1e-5)
    assert reopened_emb.texts == 1 and embedded == 4  # only the query was embedded after reopening


def test_a_different_embedder_triggers_one_re_embedding(tmp_path, docs):
    with Index(tmp_path / "ix", embedder=BagEmbedder()) as idx:
        idx.ingest(docs)
    other = BagEmbedder()
    other.name = "bag-64-v2"
    with Index(tmp_path / "ix", embedder=other) as idx:
        idx.search("refunds", 1)
    assert other.texts == 3 + 1


def test_large_stores_use_a_persisted_hnsw_index(tmp_path, docs):
    with Index(tmp_path / "ix", retriever="dense", embedder=BagEmbedder(), ann_threshold=2) as idx:
        idx.ingest(docs)
        assert idx.search("Norway", 1)[0].source.endswith("shipping.txt")
    [ann_file] = (tmp_path / "ix").glob("ann-*.hnsw")
    stamp = ann_file.stat().st_mtime_ns
    with Index(tmp_path / "ix", embedder=BagEmbedder(), ann_threshold=2) as idx:
        idx.search("Norway", 1)
        assert isinstance(idx._retriever.ivf, HNSW)  # type: ignore[union-attr]
    assert ann_file.stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_schema_is_plain_sqlite(tmp_path, docs):
    with Index(tmp_path / "ix", retriever="tfidf") as idx:
        idx.ingest(docs)
    db = sqlite3.connect(tmp_path / "ix" / "index.sqlite")
    rows = db.execute("SELECT source, heading, text FROM chunks ORDER BY row").fetchall()
    assert any(h == "Refunds" and "30 days" in t for _, h, t in rows)
    assert not (tmp_path / "ix" / "vectors.npy").exists()  # lexical index: no vectors


def test_bad_input_gets_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        Index(tmp_path / "ix", retriever="bm25").ingest(tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown retriever"):
        Index(tmp_path / "iy", retriever="magic")
    with pytest.raises(ValueError, match="empty"):
        Index(tmp_path / "iz", retriever="bm25").search("  ")


def test_index_names_live_under_tether_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    assert default_root() == tmp_path / "indexes"
    assert index_path("support") == tmp_path / "indexes" / "support"
    assert index_path(str(tmp_path / "x")) == tmp_path / "x"


def test_real_minilm_on_a_handful_of_passages(tmp_path, docs):
    pytest.importorskip("onnxruntime")
    from tether.rag._encoder import EmbedderUnavailable, MiniLMEncoder

    try:
        enc = MiniLMEncoder()
    except EmbedderUnavailable as exc:
        pytest.skip(str(exc))
    v = enc.embed(["Refunds are issued within 30 days.", "Can I get my money back?", "Parcels ship to Norway."])
    assert v.shape == (3, 384) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)
    assert v[1] @ v[0] > v[1] @ v[2]  # money back is about refunds, not shipping
    with Index(tmp_path / "ix", retriever="dense", embedder=enc) as idx:
        idx.ingest(docs)
        assert idx.search("money back", 1)[0].source.endswith("refunds.md")


def test_a_changed_file_embeds_only_its_new_passages(tmp_path):
    emb = BagEmbedder()
    idx = Index(tmp_path / "ix", embedder=emb, chunk_tokens=16, overlap=0)
    sections = "\n".join(f"# Part {i}\n" + " ".join(f"word{i}x{j}" for j in range(10)) for i in range(4))
    idx.add_text("manual", sections)
    embedded = emb.texts
    assert len(idx) == 4
    changed = sections.replace("word2x3", "changed")
    r = idx.add_text("manual", changed)
    assert r.updated == ["manual"] and r.chunks_added == 4 and r.chunks_removed == 4
    assert emb.texts == embedded + 1  # three passages kept their text: their vectors are reused
    assert idx.search("changed", 1)[0].heading == "Part 2"
    for c in idx.chunks():  # every stored vector still belongs to its own chunk
        hit = idx.search(c.text, 1)[0]
        assert hit.id == c.id


def test_embedding_reports_progress_and_add_texts_is_one_update(tmp_path):
    calls: list[tuple[int, int]] = []
    emb = BagEmbedder()
    idx = Index(tmp_path / "ix", embedder=emb, progress=lambda done, total: calls.append((done, total)))
    r = idx.add_texts([(f"doc{i}", f"passage number {i} about topic {i % 3}") for i in range(130)], markdown=False)
    assert len(r.added) == 130 and len(idx) == 130
    assert calls[0] == (0, 130) and calls[-1] == (130, 130) and len(calls) == 4  # batches of 64
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    again = idx.add_texts([(f"doc{i}", f"passage number {i} about topic {i % 3}") for i in range(130)])
    assert len(again.unchanged) == 130 and calls[-1] == (130, 130) and len(calls) == 4
