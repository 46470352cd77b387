"""`tether ingest`, `tether ask` and `tether eval-retrieval` end to end (the model is a real HTTP
server on 127.0.0.1 scripted by the test)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from fake_openai_server import FakeOpenAIServer, Reply, chat_completion, tool_call
from rag_fakes import rag_cli

REPO = Path(__file__).resolve().parents[1]


def flat(text: str) -> str:
    """Error messages are wrapped into short lines: compare them with whitespace collapsed."""
    return " ".join(text.split())


def cisi_dir() -> Path:
    env = os.environ.get("TETHER_CISI_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data" / "cisi"


@pytest.fixture
def cli(monkeypatch, tmp_path):
    return rag_cli(monkeypatch, tmp_path)


@pytest.fixture
def docs(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "refunds.md").write_text("# Refunds\nRefunds are issued within 30 days of delivery.\n")
    (d / "shipping.md").write_text("# Shipping\nParcels ship to Norway within three days.\n")
    return d


def test_ingest_names_an_index_under_tether_home_and_is_incremental(cli, docs, tmp_path):
    r = cli("ingest", str(docs), "--index", "support", "--retriever", "bm25")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("2 added, 0 updated, 0 deleted, 0 unchanged; +2 -0 chunks; 2 chunks in ")
    assert (tmp_path / "home" / "indexes" / "support" / "index.sqlite").exists()
    (docs / "shipping.md").write_text("# Shipping\nParcels ship to Switzerland.\n")
    r = cli("ingest", str(docs), "--index", "support")
    assert r.stdout.startswith("0 added, 1 updated, 0 deleted, 1 unchanged; +1 -1 chunks")


def test_ingest_of_a_missing_path_is_a_usage_error(cli, tmp_path):
    r = cli("ingest", str(tmp_path / "nope"), "--index", "x", "--retriever", "bm25")
    assert r.exit_code == 2 and "no such file or folder" in flat(r.stderr)


def test_ask_pipeline_sends_numbered_passages_and_prints_the_answer(cli, docs):
    cli("ingest", str(docs), "--index", "support", "--retriever", "bm25")
    with FakeOpenAIServer([chat_completion("Refunds are issued within 30 days [1].")]) as server:
        env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}
        r = cli("ask", "Can I get a refund?", "--index", "support", "--pipeline", "--k", "2", env=env)
    assert r.exit_code == 0, r.output
    assert r.stdout == "Refunds are issued within 30 days [1].\n"
    body = server.requests[0].body
    assert "tools" not in body or not body["tools"]
    user = body["messages"][-1]["content"]
    assert user.startswith("Passages:\n\n[1] source: ") and "refunds.md | section: Refunds" in user
    assert "the passages do not say" in body["messages"][0]["content"]


def test_ask_agentic_lets_the_model_call_search(cli, docs):
    cli("ingest", str(docs), "--index", "support", "--retriever", "bm25")
    script = [chat_completion(None, [tool_call("search", {"query": "refund"})]), chat_completion("Within 30 days [1].")]
    with FakeOpenAIServer(script) as server:
        env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}
        r = cli("ask", "Can I get a refund?", "--index", "support", "--json", env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["answer"] == "Within 30 days [1]."
    tool_msg = server.requests[1].body["messages"][-2]  # [-1]: the policy's note labelling it as data
    assert tool_msg["role"] == "tool" and tool_msg["content"].startswith("[1] id=") and "Refunds are issued" in tool_msg["content"]


def test_ask_without_an_index_says_how_to_make_one(cli):
    r = cli("ask", "anything", "--index", "missing")
    assert r.exit_code == 2 and "tether ingest PATH --index missing" in flat(r.stderr)


def _toy_collection(d: Path) -> tuple[str, str, str]:
    docs = [("d1", "Refunds", "Refunds are issued within 30 days."), ("d2", "Shipping", "Parcels ship fast."),
            ("d3", "Cards", "Gift cards never expire.")]
    (d / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in docs))
    (d / "queries.jsonl").write_text(json.dumps({"id": "q1", "text": "refund"}) + "\n"
                                     + json.dumps({"id": "q2", "text": "gift card expiry"}) + "\n")
    (d / "qrels.tsv").write_text("q1\td1\t1\nq2\td3\t1\n")
    return str(d / "corpus.jsonl"), str(d / "queries.jsonl"), str(d / "qrels.tsv")


def test_eval_retrieval_json_has_the_documented_keys(cli, tmp_path):
    c, q, r_ = _toy_collection(tmp_path)
    r = cli("eval-retrieval", "--corpus", c, "--queries", q, "--qrels", r_, "--retriever", "bm25", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert list(out) == ["ndcg@10", "recall@10", "recall@100", "map", "index_seconds", "queries_per_second"]
    assert out["ndcg@10"] == 1.0 and out["map"] == 1.0 and out["queries_per_second"] > 0
    table = cli("eval-retrieval", "--corpus", c, "--queries", q, "--qrels", r_, "--retriever", "tfidf")
    assert "ndcg@10" in table.stdout and "queries_per_second" in table.stdout


def test_eval_retrieval_rejects_bad_input(cli, tmp_path):
    c, q, r_ = _toy_collection(tmp_path)
    bad = cli("eval-retrieval", "--corpus", c, "--queries", q, "--qrels", r_, "--retriever", "magic")
    assert bad.exit_code == 2 and "unknown retriever 'magic'" in flat(bad.stderr)
    missing = cli("eval-retrieval", "--corpus", str(tmp_path / "no.jsonl"), "--queries", q, "--qrels", r_)
    assert missing.exit_code == 2 and "no such file" in flat(missing.stderr)


def test_eval_retrieval_bm25_on_cisi(cli):
    d = cisi_dir()
    if not (d / "corpus.jsonl").exists():
        pytest.skip(f"CISI not found at {d}")
    r = cli("eval-retrieval", "--corpus", str(d / "corpus.jsonl"), "--queries", str(d / "queries.jsonl"),
            "--qrels", str(d / "qrels.tsv"), "--retriever", "bm25", "--json")
    out = json.loads(r.stdout)
    assert out["ndcg@10"] == pytest.approx(0.386, abs=0.005)  # bm25s + stemmer reference
    assert 0 < out["recall@10"] < out["recall@100"] < 1


def test_search_prints_a_table_of_ranked_passages_without_a_model(cli, docs, monkeypatch):
    monkeypatch.chdir(docs.parent)  # sources below the working directory are shown relative to it
    cli("ingest", str(docs), "--index", "kb", "--retriever", "bm25")
    r = cli("search", "refund within 30 days", "--index", "kb", "-k", "2")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["#", "score", "source", "heading", "snippet"]
    assert lines[1].lstrip().startswith("1 ") and "docs/refunds.md" in lines[1] and "Refunds" in lines[1]
    assert "Refunds are issued within 30 days" in r.stdout
    assert r.stdout.rstrip().endswith("ranked by bm25")  # which retriever answered


def test_search_json_has_source_heading_score_and_snippet(cli, docs):
    cli("ingest", str(docs), "--index", "kb", "--retriever", "bm25")
    r = cli("search", "parcels Norway days", "--index", "kb", "--json")  # "days": in both files
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["retriever"] == "bm25" and out["query"] == "parcels Norway days"
    top = out["hits"][0]
    assert top["rank"] == 1 and top["source"].endswith("shipping.md") and top["heading"] == "Shipping"
    assert top["score"] > out["hits"][1]["score"] and top["snippet"].startswith("Parcels ship to Norway")


def test_json_errors_are_json_and_plain_errors_are_short_lines(cli, docs):
    r = cli("search", "anything", "--index", "missing", "--json")
    assert r.exit_code == 2 and r.stderr == ""
    err = json.loads(r.stdout)
    assert err["exit_code"] == 2 and "tether ingest PATH --index missing" in err["error"]
    r = cli("ask", "anything", "--index", "missing", "--json")
    assert json.loads(r.stdout)["exit_code"] == 2
    cli("ingest", str(docs), "--index", "kb", "--retriever", "bm25")
    r = cli("ask", "anything", "--index", "kb", "--model", "openai:gpt-x")  # no API key in this environment
    assert r.exit_code == 2 and "cannot set up the model" in flat(r.stderr)
    assert all(len(line) <= 88 for line in r.stderr.splitlines())
    r = cli("ask", "anything", "--index", "kb", "--model", "openai:gpt-x", "--json")
    assert r.exit_code == 2 and "cannot set up the model" in json.loads(r.stdout)["error"]


def test_format_error_wraps_long_messages():
    from tether.cli._rag_commands import format_error

    text = format_error("word " * 60)
    assert text.startswith("tether: word") and all(len(x) <= 88 for x in text.splitlines())
    assert all(x.startswith("  ") for x in text.splitlines()[1:])


def test_eval_retrieval_with_an_index_embeds_once(cli, tmp_path):
    pytest.importorskip("onnxruntime")
    c, q, r_ = _toy_collection(tmp_path)
    args = ("eval-retrieval", "--corpus", c, "--queries", q, "--qrels", r_, "--retriever", "dense",
            "--index", "evalix", "--json")
    first = cli(*args)
    if first.exit_code == 1 and "MiniLM" in first.output:
        pytest.skip("the MiniLM model is not installed")
    assert first.exit_code == 0, first.output
    assert "embedding 3 passages" in flat(first.stderr)
    second = cli(*args)
    assert second.exit_code == 0 and "embedding" not in flat(second.stderr)  # vectors reused from the index
    assert json.loads(second.stdout)["ndcg@10"] == json.loads(first.stdout)["ndcg@10"] == 1.0
    d = tmp_path / "other"
    d.mkdir()
    (d / "x.md").write_text("# X\nsomething else\n")
    cli("ingest", str(d), "--index", "evalix")
    mixed = cli(*args)
    assert mixed.exit_code == 2 and "not documents of this collection" in json.loads(mixed.stdout)["error"]


def test_search_can_rerank_with_a_cross_encoder_given_by_path(cli, docs, tmp_path):
    from rag_fakes import tiny_cross_encoder

    pytest.importorskip("onnxruntime")
    (docs / "gamma.md").write_text("# Gamma\n" + "Radiation, rays and other physics. " * 12 + "Parcels.\n")
    cli("ingest", str(docs), "--index", "kb", "--retriever", "bm25")
    plain = json.loads(cli("search", "parcels", "--index", "kb", "--json").stdout)["hits"]
    assert plain[0]["source"].endswith("shipping.md")
    model = tiny_cross_encoder(tmp_path / "ce.onnx")
    r = cli("search", "parcels", "--index", "kb", "--json", "--rerank", str(model))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["hits"][0]["source"].endswith("gamma.md")
    bad = cli("search", "parcels", "--index", "kb", "--json", "--rerank", str(tmp_path / "none.onnx"))
    assert bad.exit_code == 2 and "no cross-encoder ONNX file" in json.loads(bad.stdout)["error"]


def test_ask_pipeline_with_the_llm_as_judge_reranks_before_answering(cli, docs):
    cli("ingest", str(docs), "--index", "kb", "--retriever", "bm25")
    # two passages: the judge is asked about each (first-stage order), then the answer call
    script = [chat_completion("0"), chat_completion("3"), chat_completion("They ship to Norway [1].")]
    with FakeOpenAIServer(script) as server:
        env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}
        r = cli("ask", "Do parcels ship to Norway, and are refunds issued?", "--index", "kb", "--pipeline",
                "--k", "2", "--rerank", "llm", "--json", env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["answer"] == "They ship to Norway [1]."
    judged = [req.body["messages"][-1]["content"] for req in server.requests[:2]]
    assert all(j.startswith("Query: Do parcels ship") for j in judged)
    second = "refunds.md" if "Refunds" in judged[1] else "shipping.md"
    assert out["passages"][0]["source"].endswith(second) and out["passages"][0]["score"] == 3.0


def test_ask_that_stops_on_a_model_error_names_the_cause(cli, docs):
    cli("ingest", str(docs), "--index", "support", "--retriever", "bm25")
    overflow = "This model's maximum context length is 4096 tokens; you requested 4184 tokens"
    for as_json in (False, True):
        script = [chat_completion(None, [tool_call("search", {"query": "refund"})]), Reply.error(400, overflow)]
        with FakeOpenAIServer(script) as server:
            env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}
            r = cli("ask", "Can I get a refund?", "--index", "support", *(["--json"] if as_json else []), env=env)
        assert r.exit_code == 3, r.output
        if as_json:
            out = json.loads(r.stdout)
            assert out["stop_reason"] == "error" and "maximum context length" in out["error"]
        else:
            assert r.stdout == "" and "stopped: error" in flat(r.stderr) and "maximum context length" in flat(r.stderr)


def test_eval_retrieval_says_when_qrels_name_unknown_ids(cli, tmp_path):
    corpus, queries, qrels = _toy_collection(tmp_path)
    Path(qrels).write_text("q1\td1\t1\nq2\tD3\t1\nq9\td2\t1\n")  # D3: a typo; q9: no such query
    r = cli("eval-retrieval", "--corpus", corpus, "--queries", queries, "--qrels", qrels, "--retriever", "bm25",
            "--json")
    assert r.exit_code == 0, r.output
    said = flat(r.stderr)
    assert "names 1 document ids not in" in said and "(e.g. D3)" in said
    assert "judges 1 queries not in" in said and "(e.g. q9)" in said
    Path(qrels).write_text("q1\tx1\t1\nq2\tx3\t1\n")  # the qrels of another collection
    r = cli("eval-retrieval", "--corpus", corpus, "--queries", queries, "--qrels", qrels, "--retriever", "bm25")
    assert r.exit_code == 2 and "none of its 2 document ids is in" in flat(r.stderr)
