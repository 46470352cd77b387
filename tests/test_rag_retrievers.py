"""Retrievers: textbook TF-IDF by hand, BM25 stemming, RRF, smoothing, kNN graph and IVF."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from rag_fakes import BagEmbedder

from tether.rag._ann import IVFIndex
from tether.rag._base import top_k
from tether.rag._dense import DenseRetriever, knn_graph
from tether.rag._fusion import FusionRetriever, HybridRetriever, rrf_scores, zscore
from tether.rag._lexical import BM25Retriever, TfidfRetriever
from tether.rag._text import simple_tokens


def test_tfidf_matches_the_textbook_by_hand():
    r = TfidfRetriever()
    r.fit(["The apple banana", "apple apple cherry", "cherry"])
    s = r.scores("apple")
    # idf(apple) = ln(4/3)+1 = 1.287682, idf(banana) = ln(2)+1 = 1.693147
    # d0 = (1.287682, 1.693147) -> cos = 1.287682 / 2.127175 ; d1 = (2*1.287682, 1.287682) -> 2/sqrt(5)
    assert s == pytest.approx([0.605352, 0.894427, 0.0], abs=1e-5)
    assert r.search("apple", 2) == [(1, pytest.approx(0.894427, abs=1e-5)), (0, pytest.approx(0.605352, abs=1e-5))]
    assert r.scores("the") == pytest.approx([0, 0, 0])  # stop word
    assert r.scores("unknown words") == pytest.approx([0, 0, 0])


def test_tokens_are_lowercase_alphanumeric_runs():
    assert simple_tokens("Hello, WORLD! e-mail x2 the") == ["hello", "world", "e", "mail", "x2"]


def test_bm25_stemming_matches_refund_to_refunds():
    docs = ["Refunds are issued within 30 days", "Shipping takes 3 days"]
    stemmed = BM25Retriever()
    stemmed.fit(docs)
    plain = BM25Retriever(stem=False)
    plain.fit(docs)
    assert stemmed.scores("refund")[0] > 0 and plain.scores("refund")[0] == 0
    assert stemmed.search("refund after 30 days", 1)[0][0] == 0


def test_bm25_of_empty_store_and_empty_query():
    r = BM25Retriever()
    r.fit([])
    assert r.search("anything", 5) == []
    r.fit(["some text here"])
    assert r.scores("the") == pytest.approx([0.0])


def test_top_k_orders_by_score_then_position():
    assert top_k(np.array([0.5, 0.9, 0.5, 0.1]), 3) == [(1, 0.9), (0, 0.5), (2, 0.5)]
    assert top_k(np.array([1.0]), 5) == [(0, 1.0)]
    assert top_k(np.array([]), 5) == []


def test_rrf_by_hand():
    a = np.array([0.5, 0.1, 0.9])  # ranks: doc2 1, doc0 2, doc1 3
    b = np.array([0.9, 0.5, 0.1])  # ranks: doc0 1, doc1 2, doc2 3
    got = rrf_scores([a, b], k=60)
    assert got == pytest.approx([1 / 62 + 1 / 61, 1 / 63 + 1 / 62, 1 / 61 + 1 / 63], rel=1e-6)


def test_hybrid_and_dense_on_a_small_store():
    docs = ["apples and pears", "shipping to norway", "refunds after thirty days", "gift cards and cash"]
    emb = BagEmbedder()
    dense = DenseRetriever(emb)
    hybrid = HybridRetriever([BM25Retriever(), dense])
    hybrid.fit(docs)
    assert dense.search("thirty days refunds", 1)[0][0] == 2
    assert hybrid.search("refunds", 1)[0][0] == 2


def test_plain_z_fusion_is_the_weighted_average_of_z_scores():
    docs = ["apples and pears", "shipping to norway", "refunds after thirty days", "gift cards and cash"]
    f = FusionRetriever(BM25Retriever(), DenseRetriever(BagEmbedder()), weight=0.3, neighbours=0)
    f.fit(docs)
    q = "refunds after days"
    want = 0.3 * zscore(f.lexical.scores(q)) + 0.7 * zscore(f.dense.scores(q))
    assert f.scores(q) == pytest.approx(want, abs=1e-5)


def test_smoothing_lifts_a_passage_whose_neighbours_match():
    rng = np.random.default_rng(1)
    # two tight clusters of 60 vectors each; passage 0 is in cluster A but its own text misses the query
    centers = rng.normal(size=(2, 64))
    vecs = np.concatenate([centers[0] + 0.05 * rng.normal(size=(60, 64)), centers[1] + 0.05 * rng.normal(size=(60, 64))])
    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
    texts = ["other words"] + ["alpha topic"] * 59 + ["beta words"] * 60
    lexical = BM25Retriever()
    lexical.fit(texts)
    dense = DenseRetriever(BagEmbedder())
    dense.set_vectors(vecs)
    f = FusionRetriever(lexical, dense, weight=1.0, neighbours=10, min_store=50)
    f.prepare()
    assert f.graph is not None and f.graph.shape == (120, 10)
    raw = zscore(lexical.scores("alpha"))
    smoothed = f.scores("alpha")
    beta = slice(60, 120)
    assert raw[0] == pytest.approx(raw[beta].mean())  # unsmoothed, passage 0 looks like cluster B
    assert smoothed[0] > smoothed[beta].max()  # smoothed, its neighbours lift it


def test_small_stores_skip_smoothing():
    f = FusionRetriever(BM25Retriever(), DenseRetriever(BagEmbedder()))
    f.fit(["alpha beta", "gamma delta", "epsilon zeta"])
    assert f.graph is None


def test_knn_graph_matches_brute_force():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(300, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    g = knn_graph(v, 4, block=64)
    sims = v @ v.T
    np.fill_diagonal(sims, -np.inf)
    assert (g == np.argsort(-sims, axis=1)[:, :4]).all()


def test_ivf_is_exact_with_every_list_probed_and_close_with_few():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(20, 16))
    v = (centers[rng.integers(0, 20, 3000)] + 0.3 * rng.normal(size=(3000, 16))).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    ivf = IVFIndex.build(v, nlist=40, nprobe=40)
    queries = v[:50] + 0.1 * rng.normal(size=(50, 16)).astype(np.float32)
    truth = [set(np.argsort(-(v @ q))[:10]) for q in queries]

    def found(q):
        rows = ivf.candidates(q)
        return set(rows[np.argsort(-(v[rows] @ q))[:10]])

    assert all(found(q) == t for q, t in zip(queries, truth, strict=True))
    ivf.nprobe = 6
    recall = np.mean([len(found(q) & t) / 10 for q, t in zip(queries, truth, strict=True)])
    assert recall >= 0.8


def test_dense_switches_to_ivf_above_the_threshold_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    v = rng.normal(size=(400, 64)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    d = DenseRetriever(BagEmbedder(), ann_threshold=300)
    d.set_vectors(v)
    assert d.ivf is not None
    d.ivf.save(str(tmp_path / "ivf.npz"))
    again = IVFIndex.load(str(tmp_path / "ivf.npz"))
    assert (again.centroids == d.ivf.centroids).all() and again.nprobe == d.ivf.nprobe
    small = DenseRetriever(BagEmbedder(), ann_threshold=300)
    small.set_vectors(v[:100])
    assert small.ivf is None
