"""Ranking metrics against a toy case computed by hand, and the BEIR loader."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy")

from tether.rag._evaluate import load_collection
from tether.rag._metrics import average_precision, ndcg_at_k, recall_at_k, summarize

RANKED = ["d1", "d2", "d3", "d4", "d5"]
QRELS = {"d1": 1, "d3": 1, "d6": 1}  # d6 is relevant but never retrieved


def test_ndcg_by_hand():
    # DCG = 1/log2(2) + 1/log2(4) = 1.5 ; IDCG = 1 + 1/log2(3) + 1/log2(4) = 2.1309298
    assert ndcg_at_k(RANKED, QRELS, 10) == pytest.approx(1.5 / 2.1309298, abs=1e-6)
    assert ndcg_at_k(RANKED, QRELS, 10) == pytest.approx(0.703918, abs=1e-6)
    # cut at 1: only d1, ideal at 1 is also 1
    assert ndcg_at_k(RANKED, QRELS, 1) == 1.0


def test_graded_ndcg_uses_linear_gains():
    # DCG = 1/1 + 2/log2(3) = 2.2618595 ; IDCG = 2/1 + 1/log2(3) = 2.6309298
    assert ndcg_at_k(["b", "a"], {"a": 2, "b": 1}, 10) == pytest.approx(0.859719, abs=1e-6)


def test_recall_by_hand():
    assert recall_at_k(RANKED, QRELS, 2) == pytest.approx(1 / 3)
    assert recall_at_k(RANKED, QRELS, 10) == pytest.approx(2 / 3)


def test_average_precision_by_hand():
    # precision at the relevant ranks: 1/1 (d1), 2/3 (d3); d6 missing counts 0; over 3 relevant
    assert average_precision(RANKED, QRELS) == pytest.approx((1 + 2 / 3) / 3)


def test_zero_relevance_judgments_do_not_count():
    assert recall_at_k(["a"], {"a": 0, "b": 1}, 10) == 0.0
    assert ndcg_at_k(["a"], {"a": 0}, 10) == 0.0


def test_summarize_averages_over_judged_queries_only():
    runs = {"q1": RANKED, "q2": ["x"], "q3": ["y"]}
    qrels = {"q1": QRELS, "q2": {"x": 1}}  # q3 unjudged: ignored
    s = summarize(runs, qrels)
    assert s["ndcg@10"] == pytest.approx((0.703918 + 1.0) / 2, abs=1e-6)
    assert s["recall@10"] == pytest.approx((2 / 3 + 1) / 2)
    assert s["map"] == pytest.approx(((1 + 2 / 3) / 3 + 1) / 2)
    with pytest.raises(ValueError, match="judgment"):
        summarize({"q3": ["y"]}, qrels)


def test_load_collection_reads_beir_files(tmp_path):
    (tmp_path / "corpus.jsonl").write_text(
        json.dumps({"_id": "1", "title": "Cats", "text": "purr"}) + "\n" + json.dumps({"id": 2, "text": "bark"}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"id": "q", "text": "cat"}) + "\n")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq\t1\t1\nq\t2\t0\n")
    col = load_collection(tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv")
    assert col.doc_ids == ["1", "2"] and col.doc_texts == ["Cats purr", "bark"]
    assert col.queries == {"q": "cat"} and col.qrels == {"q": {"1": 1, "2": 0}}


def test_load_collection_names_the_bad_line(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"id": "1", "text": "x"}\nnot json\n')
    (tmp_path / "q.jsonl").write_text("")
    (tmp_path / "r.tsv").write_text("")
    with pytest.raises(ValueError, match=r"c.jsonl:2"):
        load_collection(tmp_path / "c.jsonl", tmp_path / "q.jsonl", tmp_path / "r.tsv")
