"""Index consistency across retrievers and embedders, the search tool's cap, TREC qrels."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from tether.rag._base import Hit
from tether.rag._dense import knn_graph
from tether.rag._evaluate import load_collection
from tether.rag._index import Index
from tether.rag._neighbours import HNSW
from tether.rag._text import simple_tokens
from tether.rag._tool import shape_hits


class HashEmbedder:
    """Hashed bag-of-words vectors; `salt` changes the hashing (another embedder)."""

    dim = 32

    def __init__(self, salt: int = 0) -> None:
        self.salt = salt
        self.name = f"hash-{salt}"

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for tok in simple_tokens(t):
                digest = hashlib.md5(f"{self.salt}:{tok}".encode()).digest()
                out[i, int.from_bytes(digest[:4], "little") % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1)


def test_changes_made_under_a_lexical_retriever_do_not_leave_stale_vectors(tmp_path):
    emb = HashEmbedder()
    with Index(tmp_path / "ix", retriever="dense", embedder=emb) as idx:
        idx.add_text("a", "apples are red fruit")
        idx.add_text("b", "bananas are yellow fruit")
        assert idx.search("apples", 1)[0].source == "a"
    with Index(tmp_path / "ix", retriever="bm25", embedder=emb) as idx:
        idx.add_text("a", "zebras run on the savanna")  # same number of chunks, new text, no vectors kept
    with Index(tmp_path / "ix", retriever="dense", embedder=emb) as idx:
        top = idx.search("zebras savanna", 1)[0]
        assert top.source == "a" and top.score == pytest.approx(
            float(emb.embed(["zebras run on the savanna"])[0] @ emb.embed(["zebras savanna"])[0]), abs=1e-5)


def test_neighbour_graph_is_rebuilt_for_another_embedder(tmp_path):
    words = [f"w{i}" for i in range(40)]
    with Index(tmp_path / "ix", retriever="best", embedder=HashEmbedder(0)) as idx:
        for i in range(120):  # above the smoothing retriever's min_store
            idx.add_text(f"s{i}", " ".join(words[(i * 7 + j) % 40] for j in range(5)))
        idx.search("w1 w2", 3)
    other = HashEmbedder(3)
    with Index(tmp_path / "ix", retriever="best", embedder=other) as idx:
        idx.search("w1 w2", 3)
        retriever = idx._retriever
        vectors = np.asarray(retriever.dense.vectors)  # type: ignore[union-attr]
        assert np.allclose(vectors, other.embed([c.indexed_text for c in idx.chunks()]))
        assert np.array_equal(retriever.graph, knn_graph(vectors, 10))  # type: ignore[union-attr]


def test_hnsw_index_is_rebuilt_for_another_embedder(tmp_path):
    texts = [f"topic{i % 9} item{i} part{i % 4}" for i in range(30)]
    with Index(tmp_path / "ix", retriever="dense", embedder=HashEmbedder(0), ann_threshold=2) as idx:
        for i, t in enumerate(texts):
            idx.add_text(f"s{i}", t)
        idx.search("topic1", 1)
    other = HashEmbedder(5)
    with Index(tmp_path / "ix", retriever="dense", embedder=other, ann_threshold=2) as idx:
        idx.search("topic1", 1)
        ann = idx._retriever.ivf  # type: ignore[union-attr]
        assert isinstance(ann, HNSW)
        vectors = other.embed([c.indexed_text for c in idx.chunks()])
        found = ann.index.get_items(ann.labels)
        assert np.allclose(found, vectors, atol=1e-6)  # the new embedder's vectors, not the old ones


def test_search_tool_output_never_exceeds_its_cap() -> None:
    """Over the cap, the executor would cut the result again (and hide the 'more passages' note)."""
    for a in range(100, 700, 37):
        for b in range(50, 700, 41):
            hits = [Hit(i, 1.0, f"id{i}", "src", "", ("w " * a)[:a] if i % 2 else ("x " * b)[:b]) for i in range(10)]
            out = shape_hits(hits, max_chars=3500)
            assert len(out) <= 3500
            if "more passages not shown" in out:
                assert out.rstrip().endswith("search with a narrower query)")
    long = [Hit(i, 1.0, f"id{i}", "src", "h", "word " * 300) for i in range(10)]
    for cap in (120, 300, 1000):
        assert len(shape_hits(long, max_chars=cap)) <= cap


def test_trec_qrels_with_an_iteration_column(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"id": "d1", "text": "a"}\n{"id": "d2", "text": "b"}\n')
    (tmp_path / "q.jsonl").write_text('{"id": "q1", "text": "a"}\n')
    (tmp_path / "qrels.txt").write_text("q1 0 d2 1\nq1 0 d1 0\n")
    col = load_collection(tmp_path / "c.jsonl", tmp_path / "q.jsonl", tmp_path / "qrels.txt")
    assert col.qrels == {"q1": {"d2": 1, "d1": 0}}


def test_search_tool_accepts_the_k_it_advertises_as_default(tmp_path):
    import asyncio

    from tether.models._scripted import call
    from tether.rag._tool import search_tool
    from tether.tools._executor import CallContext, Executor

    with Index(tmp_path / "ix", retriever="bm25") as idx:
        for i in range(20):
            idx.add_text(f"s{i}", f"refund policy number {i}")
        tool = search_tool(idx, default_k=15)
        prop = tool.parameters["properties"]["k"]
        assert prop["minimum"] <= prop["default"] <= prop["maximum"]
        result = asyncio.run(Executor([tool]).execute(call("search", query="refund", k=15), CallContext("r")))
        assert not result.is_error and "[15]" in result.content
