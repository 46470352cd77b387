"""An index shared by processes, failed commands and stopped ingests (issue 30): real processes
through the CLI, and the library with a stand-in embedder."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hang import HANG

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from rag_fakes import BagEmbedder

from tether.rag._index import Index

REPO = Path(__file__).resolve().parents[1]


def tether(home: Path, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "TETHER_HOME": str(home), "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen([sys.executable, "-m", "tether.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def run(home: Path, *args: str) -> subprocess.CompletedProcess:
    proc = tether(home, *args)
    out, err = proc.communicate(timeout=HANG)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def folder(root: Path, name: str, files: int) -> Path:
    d = root / name
    d.mkdir()
    for i in range(files):
        (d / f"{name}{i}.md").write_text(f"# {name} {i}\n" + f"word{i} {name} passage text about item {i}. " * 30)
    return d


def rows_are_whole(path: Path) -> tuple[int, int]:
    """(chunks, sources) of an index, after checking the database and the row numbering."""
    with sqlite3.connect(path / "index.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = [r for (r,) in db.execute("SELECT row FROM chunks ORDER BY row")]
        assert rows == list(range(len(rows)))  # no row -1, no gaps
        sources = db.execute("SELECT COUNT(*) FROM sources").fetchone()[0]
        per_source = db.execute("SELECT SUM(chunks) FROM sources").fetchone()[0] or 0
        assert per_source == len(rows)
    return len(rows), sources


def test_two_processes_ingesting_into_one_index_both_land(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    home = tmp_path / "home"
    folders = [folder(tmp_path, name, 20) for name in ("alpha", "beta", "gamma", "delta")]
    index = home / "indexes" / "kb"
    for a, b in ((folders[0], folders[1]), (folders[2], folders[3])):
        # dense: each embeds for seconds between reading the index and writing it (the race's window)
        procs = [tether(home, "ingest", str(d), "--index", "kb", "--retriever", "dense") for d in (a, b)]
        outs = [p.communicate(timeout=HANG) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
    _, sources = rows_are_whole(index)
    assert sources == 80
    again = run(home, "ingest", str(folders[0]), "--index", "kb")
    assert again.returncode == 0 and again.stdout.startswith("0 added, 0 updated, 0 deleted, 20 unchanged"), again
    found = run(home, "search", "word7 gamma", "--index", "kb", "--json")
    assert found.returncode == 0 and "gamma7.md" in found.stdout


def test_an_ingest_waits_for_the_process_writing_to_the_index(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = folder(tmp_path, "first", 2)
    assert run(home, "ingest", str(first), "--index", "kb", "--retriever", "bm25").returncode == 0
    index = home / "indexes" / "kb"
    fd = os.open(index / "write.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # this test is the other writer
    try:
        proc = tether(home, "ingest", str(folder(tmp_path, "second", 3)), "--index", "kb")
        assert proc.stderr is not None
        said = proc.stderr.readline()  # its first line, or "" when it finished without waiting
        assert "waiting for another process writing to the index" in said
        assert proc.poll() is None and rows_are_whole(index)[1] == 2  # still waiting, and nothing written
    finally:
        os.close(fd)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, err
    assert rows_are_whole(index)[1] == 5


def test_a_failed_ingest_leaves_no_index_behind(tmp_path: Path) -> None:
    home = tmp_path / "home"
    indexes = home / "indexes"
    r = run(home, "ingest", str(tmp_path / "nonexistent"), "--index", "bad1")
    assert r.returncode == 2 and "no such file or folder" in " ".join(r.stderr.split())
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "picture.png").write_bytes(b"\x89PNG\r\n")
    r = run(home, "ingest", str(empty), "--index", "bad2")
    assert r.returncode == 2 and "no files to ingest" in " ".join(r.stderr.split()), r
    assert not (indexes / "bad1").exists() and not (indexes / "bad2").exists()
    r = run(home, "search", "anything", "--index", "bad1")
    assert r.returncode == 2 and "no index at" in " ".join(r.stderr.split())


def test_an_empty_folder_into_an_existing_index_is_said(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run(home, "ingest", str(folder(tmp_path, "docs", 2)), "--index", "kb", "--retriever", "bm25").returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(home, "ingest", str(empty), "--index", "kb")
    assert r.returncode == 0 and "no files to ingest" in " ".join(r.stderr.split())


def test_a_refused_eval_keeps_the_index_settings(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run(home, "ingest", str(folder(tmp_path, "docs", 2)), "--index", "kb", "--retriever", "bm25").returncode == 0
    col = tmp_path / "col"
    col.mkdir()
    (col / "corpus.jsonl").write_text('{"id": "d1", "text": "a document"}\n')
    (col / "queries.jsonl").write_text('{"id": "q1", "text": "document"}\n')
    (col / "qrels.tsv").write_text("q1\td1\t1\n")
    r = run(home, "eval-retrieval", "--corpus", str(col / "corpus.jsonl"), "--queries", str(col / "queries.jsonl"),
            "--qrels", str(col / "qrels.tsv"), "--retriever", "tfidf", "--index", "kb")
    assert r.returncode == 2 and "use a separate index" in " ".join(r.stderr.split())
    with sqlite3.connect(home / "indexes" / "kb" / "index.sqlite") as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'retriever'").fetchone() == ("bm25",)


class StopsAfter(BagEmbedder):
    """Raises KeyboardInterrupt on its `calls`-th call: the user pressed Ctrl-C mid-ingest."""

    def __init__(self, calls: int | None) -> None:
        super().__init__()
        self.stop_at = calls

    def embed(self, texts):
        if self.stop_at is not None and self.calls + 1 >= self.stop_at:
            raise KeyboardInterrupt
        return super().embed(texts)


def test_a_stopped_ingest_resumes_from_its_last_batch(tmp_path: Path) -> None:
    texts = [(f"doc{i}", f"passage {i} about topic{i % 7} and more words") for i in range(300)]
    stopped = StopsAfter(4)  # three batches of 64 done
    with pytest.raises(KeyboardInterrupt), Index(tmp_path / "ix", retriever="dense", embedder=stopped) as idx:
        idx.add_texts(texts)
    resumed = StopsAfter(None)
    with Index(tmp_path / "ix", retriever="dense", embedder=resumed) as idx:
        idx.add_texts(texts)
        assert resumed.texts == 300 - 3 * 64  # the checkpointed batches were not embedded again
        assert len(idx) == 300 and idx.search("topic3", k=1)[0].text.endswith("topic3 and more words")
    with sqlite3.connect(tmp_path / "ix" / "index.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM embed_cache").fetchone()[0] == 0  # cleared once stored


class Gate(BagEmbedder):
    """Waits on its `at`-th call until released: an ingest caught while it embeds."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.reached, self.release = threading.Event(), threading.Event()

    def embed(self, texts):
        if self.calls + 1 == self.at:
            self.reached.set()
            assert self.release.wait(HANG)
        return super().embed(texts)


def test_an_index_is_searchable_by_its_words_while_its_vectors_are_computed(tmp_path: Path) -> None:
    texts = [(f"doc{i}", f"passage {i} about topic{i % 7} and more words") for i in range(300)]
    gate = Gate(3)  # two batches of 64 embedded, then the ingest waits
    writer = Index(tmp_path / "ix", embedder=gate)  # `best`: BM25 and dense fused
    ingest = threading.Thread(target=writer.add_texts, args=(texts,))
    ingest.start()
    try:
        assert gate.reached.wait(HANG)
        reader = Index(tmp_path / "ix", embedder=BagEmbedder())
        hits = reader.search("topic3", k=3)
        assert len(hits) == 3 and all(h.text.endswith("topic3 and more words") for h in hits)
        assert reader.answered_by == "bm25"
        assert reader.vectors_pending and "being computed (128 of 300 passages)" in reader.vectors_pending
        r = run(tmp_path / "home", "search", "topic3", "--index", str(tmp_path / "ix"), "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["retriever"] == "bm25" and "being computed" in out["note"] and len(out["hits"]) == 10
        assert "answered by bm25 meanwhile" in " ".join(r.stderr.split())
    finally:
        gate.release.set()
        ingest.join(HANG)
    assert gate.texts == 300  # each passage embedded once
    hits = reader.search("topic3", k=3)
    assert reader.answered_by == "best" and reader.vectors_pending is None
    assert all(h.text.endswith("topic3 and more words") for h in hits)
    writer.close()
    reader.close()


def test_an_open_index_sees_what_another_writer_stored(tmp_path: Path) -> None:
    reader = Index(tmp_path / "ix", retriever="dense", embedder=BagEmbedder())
    writer = Index(tmp_path / "ix", retriever="dense", embedder=BagEmbedder())
    writer.add_text("one", "apples grow on trees")
    assert [h.source for h in reader.search("apples", k=5)] == ["one"]
    writer.add_text("two", "pears grow on trees too")
    assert sorted(h.source for h in reader.search("pears", k=5)) == ["one", "two"]
    writer.close()
    reader.close()


RANK_UNDER_SEED = """
import random
from tether.rag._evaluate import Collection, evaluate
from tether.rag._settings import BEST
from tether.rag._lexical import BM25Retriever
rng = random.Random(0)
vocab = [f"w{i}x" for i in range(80)]  # a small vocabulary: many feedback terms tie
docs = [" ".join(rng.sample(vocab, 8)) for _ in range(300)]
queries = {f"q{i}": " ".join(rng.sample(vocab, 2)) for i in range(40)}
qrels = {q: {f"d{j}": 1 for j in rng.sample(range(300), 5)} for q in queries}
r = evaluate(BM25Retriever(rm3=BEST.rm3), Collection([f"d{i}" for i in range(300)], docs, queries, qrels))
print(repr((r["ndcg@10"], r["map"])))
"""


def test_rankings_do_not_depend_on_the_hash_seed() -> None:
    """BM25 with RM3 feedback (part of `best`): the same figures in processes with other seeds
    (bm25s numbers terms in set order; ties between feedback terms followed it)."""
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO / "src")}
        done = subprocess.run([sys.executable, "-c", RANK_UNDER_SEED], env=env, capture_output=True, text=True,
                              timeout=HANG)
        assert done.returncode == 0, done.stderr
        outs.add(done.stdout)
    assert len(outs) == 1, outs


def test_binary_files_are_skipped_and_other_encodings_are_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "program.md").write_bytes(Path(sys.executable).resolve().read_bytes()[:200_000])  # an ELF renamed .md
    (d / "noise.txt").write_bytes(bytes(b % 255 + 1 for b in os.urandom(20_000)))  # random, no zero byte
    (d / "wide.txt").write_text("The quarterly zeppelin inspection is due in March.", encoding="utf-16")
    (d / "wide-nobom.txt").write_bytes("Marmalade recipes use bitter oranges.".encode("utf-16-le"))
    (d / "latin.txt").write_bytes("Le café crème coûte trois euros.".encode("cp1252"))
    r = run(home, "ingest", str(d), "--index", "kb", "--retriever", "bm25")
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "program.md: binary content" in said and "noise.txt: binary content" in said
    assert r.stdout.startswith("3 added"), r.stdout
    for query, source in (("zeppelin inspection", "wide.txt"), ("marmalade oranges", "wide-nobom.txt"),
                          ("café crème", "latin.txt")):
        found = run(home, "search", query, "--index", "kb", "--json", "-k", "1")
        hit = json.loads(found.stdout)["hits"][0]
        assert hit["source"].endswith(source) and query.split()[0] in hit["text"].lower(), hit


@pytest.mark.parametrize("retriever", ["bm25", "tfidf", "best"])
def test_a_reopened_index_takes_its_stored_lexical_state(tmp_path: Path, monkeypatch, retriever: str) -> None:
    from tether.rag._lexical import BM25Retriever, TfidfRetriever

    texts = [(f"doc{i}", f"refunds take {i} days in region {i % 5}; shipping zone {i % 3}") for i in range(50)]
    with Index(tmp_path / "ix", retriever=retriever, embedder=BagEmbedder()) as idx:
        idx.add_texts(texts)
        first = [(h.id, round(h.score, 6)) for h in idx.search("refunds region 3", k=10)]

    def refit(self, texts):
        raise AssertionError("refitted a lexical retriever whose state is stored")

    with monkeypatch.context() as m:
        m.setattr(BM25Retriever, "fit", refit)
        m.setattr(TfidfRetriever, "fit", refit)
        with Index(tmp_path / "ix", embedder=BagEmbedder()) as idx:
            assert [(h.id, round(h.score, 6)) for h in idx.search("refunds region 3", k=10)] == first
    with Index(tmp_path / "ix", embedder=BagEmbedder()) as idx:  # a change: the next search fits anew
        idx.add_text("new", "refunds region 3 special case")
        assert idx.search("refunds region 3 special", k=1)[0].source == "new"


def test_eval_retrieval_gives_the_same_figures_under_any_hash_seed(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import random

    rng = random.Random(0)
    vocab = [f"w{i}x" for i in range(80)]  # a small vocabulary: many RM3 feedback terms tie
    with (tmp_path / "corpus.jsonl").open("w") as f:
        for i in range(300):
            f.write(json.dumps({"id": f"d{i}", "text": " ".join(rng.sample(vocab, 8))}) + "\n")
    queries = {f"q{i}": " ".join(rng.sample(vocab, 2)) for i in range(40)}
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"id": q, "text": t}) + "\n" for q, t in queries.items()))
    (tmp_path / "qrels.tsv").write_text("".join(f"{q}\td{j}\t1\n" for q in queries for j in rng.sample(range(300), 5)))
    figures = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO / "src"), "TETHER_HOME": str(tmp_path)}
        done = subprocess.run([sys.executable, "-m", "tether.cli", "eval-retrieval", "--corpus",
                               str(tmp_path / "corpus.jsonl"), "--queries", str(tmp_path / "queries.jsonl"),
                               "--qrels", str(tmp_path / "qrels.tsv"), "--retriever", "best", "--json"],
                              env=env, capture_output=True, text=True, timeout=HANG)
        assert done.returncode == 0, done.stderr
        assert "tether: embedding 300 passages" in done.stderr  # progress while it embeds (before: silence)
        out = json.loads(done.stdout)
        figures.add((out["ndcg@10"], out["recall@10"], out["recall@100"], out["map"]))
    assert len(figures) == 1, figures
