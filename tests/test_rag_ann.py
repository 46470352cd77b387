"""The neighbour state (tether.rag._neighbours): the graph `best` smooths over and, above the ANN
threshold, the HNSW index, carried from one generation to the next by each change."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("hnswlib")
pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from store_fixtures import fresh_postgres_database

from tether.rag import _index
from tether.rag._dense import knn_graph
from tether.rag._index import Index
from tether.rag._lexical import BM25Retriever
from tether.rag._neighbours import HNSW, Neighbours


class RandomEmbedder:
    """Each text its own seeded random unit vector: no two passages tie, so neighbours are exact."""

    name = "random-24"
    dim = 24

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            out[i] = np.random.default_rng(seed).standard_normal(self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


TEXTS = [(f"s{i}", f"passage {i} about topic{i % 7} and theme{i % 5}") for i in range(150)]


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "ix")
    else:
        pytest.importorskip("psycopg")
        for url in fresh_postgres_database():
            yield url + "#ann"


def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count full builds of a neighbour state (each call appends the store's size)."""
    calls: list[int] = []
    original = Neighbours.build.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Neighbours], vectors: np.ndarray, *args: Any) -> Neighbours:
        calls.append(len(vectors))
        return original(cls, vectors, *args)

    monkeypatch.setattr(Neighbours, "build", classmethod(counted))
    return calls


def change(idx: Index) -> None:
    """One file changed, one removed, two added: four generations."""
    idx.add_text("s3", "passage three rewritten about topic9")
    idx.remove("s10")
    idx.add_texts([("n1", "a new passage about topic1"), ("n2", "another new one about theme2")])


def test_an_updated_graph_equals_a_rebuilt_one() -> None:
    rng = np.random.default_rng(1)

    def unit(n: int) -> np.ndarray:
        x = rng.standard_normal((n, 16)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    v = unit(300)
    live = np.arange(300)
    state = Neighbours.build(v, 10, False)
    for _ in range(6):  # each change: 4 slots dead, 5 new slots after the others
        dropped = np.sort(rng.choice(live, 4, replace=False))
        live = np.concatenate([np.setdiff1d(live, dropped), np.arange(len(v), len(v) + 5)])
        v = np.concatenate([v, unit(5)])
        state.update(v, dropped, live)
        fresh = Neighbours.build(v, 10, False, live)
        assert np.array_equal(state.rows[live], fresh.rows[live])
        np.testing.assert_allclose(state.sims[live], fresh.sims[live], atol=1e-5)
        assert not np.isin(state.rows[live], dropped).any()
    compacted = Neighbours.build(v[live], 10, False)
    state.compact(live)
    assert np.array_equal(state.rows, compacted.rows)


def test_a_change_carries_the_graph_to_the_next_search_without_a_rebuild(location: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls = builds(monkeypatch)
    with Index.open(location, retriever="best", embedder=RandomEmbedder()) as idx:
        idx.add_texts(TEXTS)
        idx.search("topic1", 3)
        assert calls == [150]
        change(idx)
        idx.search("topic1", 3)
        assert calls == [150]  # carried through four generations, never rebuilt
        retriever: Any = idx._retriever
        assert np.array_equal(retriever.graph, knn_graph(np.asarray(retriever.dense.vectors), 10))


@pytest.mark.parametrize("ann_threshold", [50, 50_000])
def test_an_ingest_builds_the_neighbour_state_so_the_first_search_builds_none(
        location: str, monkeypatch: pytest.MonkeyPatch, ann_threshold: int) -> None:
    """`tether ingest` then `tether search`: the ingest pays for the graph (and the HNSW index), says
    so on a large store, and the first search, in this process or another, only loads it."""
    calls = builds(monkeypatch)
    fits: list[int] = []
    fit = BM25Retriever.fit
    monkeypatch.setattr(BM25Retriever, "fit", lambda self, texts, *a, **kw: (fits.append(len(texts)), fit(self, texts, *a, **kw)))
    monkeypatch.setattr(_index, "_SAY_BUILD", 100)
    said: list[str] = []
    with Index.open(location, retriever="best", embedder=RandomEmbedder(), ann_threshold=ann_threshold,
                    notify=said.append) as idx:
        idx.add_texts(TEXTS)
        assert calls == [150] and idx.neighbour_builds == 1
        assert any("neighbour graph of 150 passages" in line for line in said)
        fitted = list(fits)  # SQLite: BM25 fitted by the ingest too ([150]); PostgreSQL: its server's terms
        ids = [h.id for h in idx.search("topic1 theme2", 5)]
        assert calls == [150] and idx.neighbour_builds == 1 and fits == fitted
    with Index.open(location, retriever="best", embedder=RandomEmbedder(), ann_threshold=ann_threshold) as reader:
        assert [h.id for h in reader.search("topic1 theme2", 5)] == ids
        assert reader.neighbour_builds == 0 and calls == [150] and fits == fitted
        retriever: Any = reader._retriever
        if ann_threshold > len(TEXTS):
            assert np.array_equal(retriever.graph, knn_graph(np.asarray(retriever.dense.vectors), 10))
        else:
            assert isinstance(retriever.dense.ivf, HNSW)


def test_a_change_of_most_of_the_store_rebuilds_the_state_in_the_ingest(location: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = builds(monkeypatch)
    with Index.open(location, retriever="best", embedder=RandomEmbedder()) as idx:
        idx.add_texts(TEXTS[:20])
        idx.add_texts(TEXTS[20:])  # 130 new next to 20: built whole, not carried
        assert calls == [20, 150]
        idx.search("topic1", 3)
        assert calls == [20, 150]
        retriever: Any = idx._retriever
        assert np.array_equal(retriever.graph, knn_graph(np.asarray(retriever.dense.vectors), 10))


def test_an_ingest_stopped_while_it_builds_the_neighbour_state_keeps_the_index_and_the_next_finishes(
        location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for src, text in TEXTS:
        (docs / f"{src}.txt").write_text(text)

    def stopped(*args: Any) -> Neighbours:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Neighbours, "build", classmethod(stopped))
        with pytest.raises(KeyboardInterrupt), Index.open(location, retriever="best", embedder=RandomEmbedder()) as idx:
            idx.ingest(docs)
    assert Index.exists(location)  # its embeddings were checkpointed: kept, not discarded
    calls = builds(monkeypatch)
    with Index.open(location, retriever="best", embedder=RandomEmbedder()) as idx:
        report = idx.ingest(docs)  # nothing changed: it builds the state the stopped one did not store
        assert not report.changed and calls == [150]
        assert [h.source for h in idx.search("topic1", 3)]
        idx.ingest(docs)
        assert calls == [150]  # stored now: neither the search nor another ingest builds it again


def test_a_graph_of_another_generation_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer stopped after committing its vectors, before carrying the graph: the stored graph is of
    the last generation (same size, as a file was only rewritten) and the next search rebuilds it."""
    with Index(tmp_path / "ix", retriever="best", embedder=RandomEmbedder()) as idx:
        idx.add_texts(TEXTS)
        idx.search("topic1", 3)
        monkeypatch.setattr(Index, "_update_neighbours", lambda *a: None)
        idx.add_text("s3", "passage three rewritten about topic9")
    with Index(tmp_path / "ix", retriever="best", embedder=RandomEmbedder()) as idx:
        idx.search("topic1", 3)
        retriever: Any = idx._retriever
        assert np.array_equal(retriever.graph, knn_graph(np.asarray(retriever.dense.vectors), 10))


def test_above_the_threshold_the_hnsw_index_follows_each_change_and_repeats(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = builds(monkeypatch)

    def run(path: Path) -> tuple[list[str], np.ndarray, np.ndarray, Any]:
        with Index(path, retriever="best", embedder=RandomEmbedder(), ann_threshold=50) as idx:
            idx.add_texts(TEXTS)
            idx.search("topic1", 3)
            change(idx)
            hits = idx.search("topic1 theme2", 5)
            r: Any = idx._retriever
            return [h.id for h in hits], np.array(r.graph), np.asarray(r.dense.vectors), r.dense.ivf

    ids, graph, vectors, ann = run(tmp_path / "a")
    assert calls == [150]
    again, graph_again, _, _ = run(tmp_path / "b")
    assert ids == again and np.array_equal(graph, graph_again)  # the same changes give the same answers
    labels = ann.labels[ann.labels >= 0]  # per slot; the two removed passages' slots dead (-1)
    assert isinstance(ann, HNSW) and len(ann.labels) == 153 and len(labels) == len(vectors) == 151
    np.testing.assert_allclose(ann.index.get_items(labels), vectors, atol=1e-6)  # each passage's own vector
    exact = knn_graph(vectors, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(graph, exact, strict=True)])
    assert recall > 0.9
    # The file written by the first search stays; the changes since are a log in neighbours.npz,
    # which another process replays on it: the same graph as the writer's, so the same answers.
    assert [f.name for f in (tmp_path / "a").glob("ann-*.hnsw")] == ["ann-1.hnsw"]
    with Index(tmp_path / "a", retriever="best", embedder=RandomEmbedder(), ann_threshold=50) as reader:
        assert [h.id for h in reader.search("topic1 theme2", 5)] == ids
        replayed: Any = reader._retriever
        assert isinstance(replayed.dense.ivf, HNSW) and len(replayed.dense.ivf.labels) == 153
        queries = RandomEmbedder().embed([f"probe {i}" for i in range(20)])
        assert all(np.array_equal(np.sort(ann.candidates(q)), np.sort(replayed.dense.ivf.candidates(q))) for q in queries)
    assert calls == [150, 150]  # one build per run; the reader built nothing


def test_a_graph_built_on_a_tiny_store_is_rebuilt_once_it_can_hold_k_neighbours(tmp_path: Path) -> None:
    with Index(tmp_path / "ix", retriever="best", embedder=RandomEmbedder()) as idx:
        idx.add_texts(TEXTS[:8])
        idx.search("topic1", 3)  # a graph of 7 neighbours per passage
        for start in range(8, len(TEXTS), 4):  # small changes, each carried
            idx.add_texts(TEXTS[start : start + 4])
        idx.search("topic1", 3)
        retriever: Any = idx._retriever
        assert np.array_equal(retriever.graph, knn_graph(np.asarray(retriever.dense.vectors), 10))
    stored = Neighbours.load(tmp_path / "ix" / "neighbours.npz", None, RandomEmbedder.dim)
    assert stored.k == 10  # else every search would rebuild the 10-neighbour graph by brute force
