"""Retrieval correctness cases (issue 45, parts 3 and 5): ingest cost linear in the change (BM25
state carried across generations, rows renumbered in place), binary-ish bytes, special files,
a stopped ingest, an empty index, a bad embedder file, BM25's top-k, and the CLI's overflow advice."""

from __future__ import annotations

import fcntl
import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hang import HANG

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from fake_openai_server import FakeOpenAIServer, Reply
from rag_fakes import PROVIDER_VARS, rag_cli

from tether.rag._index import Index
from tether.rag._lexical import RM3, BM25Retriever
from tether.rag._loaders import UnsupportedFile, decode_text

REPO = Path(__file__).resolve().parents[1]


def flat(text: str) -> str:
    return " ".join(text.split())


def tether(home: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    env.update(TETHER_HOME=str(home), PYTHONPATH=str(REPO / "src"))
    return subprocess.Popen([sys.executable, "-m", "tether.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run(home: Path, *args: str) -> subprocess.CompletedProcess:
    proc = tether(home, *args)
    try:
        out, err = proc.communicate(timeout=HANG)  # only a hang reaches this
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def cli(monkeypatch, tmp_path):
    return rag_cli(monkeypatch, tmp_path)


@pytest.fixture
def docs(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "refunds.md").write_text("# Refunds\nRefunds are issued within 30 days of delivery.\n")
    (d / "shipping.md").write_text("# Shipping\nParcels ship to Norway within three days.\n")
    (d / "warranty.md").write_text("# Warranty\nA broken kettle is replaced under warranty.\n")
    return d


def rows(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path / "index.sqlite") as db:
        got = db.execute("SELECT row, source FROM chunks ORDER BY row").fetchall()
        per_source = dict(db.execute("SELECT path, chunks FROM sources").fetchall())
        slots = int(db.execute("SELECT value FROM meta WHERE key = 'slots'").fetchone()[0])
    # stable slots: none negative, none past the count (removed chunks leave gaps until a compaction)
    assert all(0 <= r < slots for r, _ in got) and 4 * (slots - len(got)) <= slots
    counted: dict[str, int] = {}
    for _, src in got:
        counted[src] = counted.get(src, 0) + 1
    assert counted == per_source
    return got


# -- ingest linear in the change ---------------------------------------------------------------


@pytest.mark.parametrize("rm3", [None, RM3()])
def test_bm25_update_ranks_as_a_fit_on_the_resulting_store(rm3) -> None:
    rng = random.Random(7)
    words = ["refund", "policy", "days", "customer", "order", "shipping", "returns", "broken", "item", "warranty", "store", "credit"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 30))) for _ in range(120)]
    updated = BM25Retriever(rm3=rm3)
    updated.fit(texts[:80])
    updated.update([0, 17, 18, 79], texts[80:])
    kept = [t for i, t in enumerate(texts[:80]) if i not in (0, 17, 18, 79)] + texts[80:]
    fitted = BM25Retriever(rm3=rm3)
    fitted.fit(kept)
    for q in ("refund days", "broken warranty credit", "store", "nothing here"):
        assert np.allclose(updated.scores(q), fitted.scores(q), atol=1e-5), q


def test_an_index_changed_file_by_file_searches_as_one_built_at_once(tmp_path: Path) -> None:
    rng = random.Random(3)
    words = [f"w{i}" for i in range(40)]
    texts = {f"doc{i}": " ".join(rng.choice(words) for _ in range(25)) for i in range(30)}
    with Index(tmp_path / "grown", retriever="bm25") as grown:
        grown.add_texts(list(texts.items())[:20], markdown=False)
        grown.search("w1", k=3)  # stores the lexical state of this generation
        for name in ("doc3", "doc11", "doc0"):
            grown.remove(name)
        grown.add_texts(list(texts.items())[20:], markdown=False)
        grown.add_text("doc5", "w7 w7 w8 replaced", markdown=False)
        state = grown._meta("lexical-bm25.npz")
        assert state is not None and state.startswith(grown._meta("generation") + ":")  # carried, not refitted
        got = {q: [(h.source, round(h.score, 4)) for h in grown.search(q, k=8)] for q in ("w1 w2", "w7", "w33 w5")}
    rows(tmp_path / "grown")
    final = {k: v for k, v in texts.items() if k not in ("doc3", "doc11", "doc0", "doc5")}
    final["doc5"] = "w7 w7 w8 replaced"
    with Index(tmp_path / "fresh", retriever="bm25") as fresh:
        fresh.add_texts(list(final.items()), markdown=False)
        want = {q: [(h.source, round(h.score, 4)) for h in fresh.search(q, k=8)] for q in got}
    assert {q: sorted(v) for q, v in got.items()} == {q: sorted(v) for q, v in want.items()}


def test_rows_stay_contiguous_when_sources_in_the_middle_go(tmp_path: Path, docs: Path) -> None:
    for i in range(6):
        (docs / f"more{i}.md").write_text(f"# More {i}\n" + f"item{i} words " * 300)  # several chunks each
    with Index(tmp_path / "ix", retriever="bm25") as idx:
        idx.ingest(docs)
        before = rows(tmp_path / "ix")
        (docs / "more1.md").unlink()
        (docs / "more4.md").unlink()
        (docs / "refunds.md").write_text("# Refunds\nNo refunds after 60 days.\n")
        report = idx.ingest(docs)
        after = rows(tmp_path / "ix")
        gone = sum(1 for _, s in before if s.endswith(("more1.md", "more4.md", "refunds.md")))
        assert report.chunks_removed == gone and len(after) == len(before) - gone + 1
        kept_order = [s for _, s in before if not s.endswith(("more1.md", "more4.md", "refunds.md"))]
        assert [s for _, s in after][: len(kept_order)] == kept_order  # kept rows keep their order
        assert idx.search("refunds 60 days", k=1)[0].source.endswith("refunds.md")


# -- what is text --------------------------------------------------------------------------------


def test_bytes_above_0x7f_that_are_not_utf8_are_not_text(tmp_path: Path, docs: Path) -> None:
    blob = bytes(range(0xA0, 0x100)) * 427  # 40 KB
    with pytest.raises(UnsupportedFile, match="above 0x7F"):
        decode_text(blob, "blob.txt")
    # Windows-1252 text (a few accented letters) is still read
    assert decode_text("Le café crème coûte 3 € à Paris.\n".encode("cp1252")) == "Le café crème coûte 3 € à Paris.\n"
    (docs / "blob.txt").write_bytes(blob)
    with Index(tmp_path / "ix", retriever="bm25") as idx:
        report = idx.ingest(docs)
        assert [s.split(":")[0] for s in report.skipped] == [(docs / "blob.txt").as_posix()]
        assert all("blob" not in s for s in idx.sources())


# -- special files and stopped ingests -------------------------------------------------------------


def test_a_fifo_or_device_given_to_ingest_is_refused_without_reading_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    r = run(home, "ingest", str(fifo), "--index", "kb", "--retriever", "bm25")  # would wait for a writer
    assert r.returncode == 2 and "FIFO" in flat(r.stderr) and "not a regular file" in flat(r.stderr), r
    assert not Index.exists(str(home / "indexes" / "kb"))
    r = run(home, "ingest", "/dev/null", "--index", "kb", "--retriever", "bm25")
    assert r.returncode == 2 and "device" in flat(r.stderr), r
    assert not Index.exists(str(home / "indexes" / "kb"))


def test_a_sigterm_during_ingest_leaves_no_index_that_reports_empty(tmp_path: Path, docs: Path) -> None:
    home = tmp_path / "home"
    where = home / "indexes" / "kb"
    where.mkdir(parents=True)
    fd = os.open(where / "write.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer: the ingest waits for it, and says so
    try:
        proc = tether(home, "ingest", str(docs), "--index", "kb", "--retriever", "bm25")
        assert proc.stderr is not None
        line = proc.stderr.readline()  # returns once the ingest is waiting (or has ended)
        assert "waiting for another process" in line, line
        proc.terminate()
        _, err = proc.communicate(timeout=HANG)
    finally:
        os.close(fd)
    assert proc.returncode == 143 and "stopped by SIGTERM" in flat(err) and "no index was created" in flat(err), err
    r = run(home, "search", "refund", "--index", "kb")
    assert r.returncode != 0 and "no index at" in flat(r.stderr), r


def test_search_on_an_index_without_passages_says_so_and_fails(tmp_path: Path, cli) -> None:
    Index(tmp_path / "home" / "indexes" / "kb", retriever="bm25").close()  # e.g. a killed first ingest
    r = cli("search", "refund", "--index", "kb")
    assert r.exit_code == 1 and "has no passages" in flat(r.stderr) and r.stdout == "", r.output
    r = cli("search", "refund", "--index", "kb", "--json")
    assert r.exit_code == 1 and "has no passages" in json.loads(r.stdout)["error"]


# -- embedder file -------------------------------------------------------------------------------


def test_a_bad_embed_model_file_is_one_line_naming_it(tmp_path: Path, cli, docs: Path, monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tokenizers")
    from tether.rag._encoder import EmbedderUnavailable, MiniLMEncoder

    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"this is not an onnx graph\n" * 10)
    monkeypatch.setenv("TETHER_EMBED_MODEL", str(bad))
    with pytest.raises(EmbedderUnavailable) as caught:
        MiniLMEncoder()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"TETHER_EMBED_MODEL={bad}: onnxruntime cannot load it")
    r = cli("ingest", str(docs), "--index", "kb", "--retriever", "dense", env={"TETHER_EMBED_MODEL": str(bad)})
    assert r.exit_code == 1 and f"TETHER_EMBED_MODEL={bad}" in flat(r.stderr), r.output


# -- BM25's top-k ----------------------------------------------------------------------------------


def test_bm25_search_returns_only_passages_that_match_a_query_term(tmp_path: Path, docs: Path, cli) -> None:
    with Index(tmp_path / "ix", retriever="bm25") as idx:
        idx.ingest(docs)
        hits = idx.search("kettle", k=3)
        assert [h.source.rsplit("/", 1)[-1] for h in hits] == ["warranty.md"] and hits[0].score > 0
        assert idx.search("zeppelin", k=3) == []
    cli("ingest", str(docs), "--index", "kb", "--retriever", "bm25")
    r = cli("search", "zeppelin", "--index", "kb")
    assert r.exit_code == 0 and r.stdout.strip() == "no passages matched", r.output


# -- overflow advice for CLI users ---------------------------------------------------------------------


def test_ask_pipeline_overflow_names_the_cli_options(cli, docs) -> None:
    cli("ingest", str(docs), "--index", "support", "--retriever", "bm25")
    overflow = "This model's maximum context length is 4096 tokens; you requested 4184 tokens"
    with FakeOpenAIServer([Reply.error(400, overflow)]) as server:
        env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}
        r = cli("ask", "Can I get a refund?", "--index", "support", "--pipeline", env=env)
    assert r.exit_code == 3 and "maximum context length" in flat(r.stderr), r.output
    assert "--k, now 5" in flat(r.stderr) and "--model" in flat(r.stderr)


def test_ask_overflow_advice_names_no_library_setting(cli, docs, monkeypatch) -> None:
    import tether.rag._answer as answer

    said = ("ContextOverflow: the context needs 5000 tokens, over this run's bound of 4000 even after compaction "
            "(the last 1 turns are kept whole); raise Limits.max_input_tokens or cap tool results lower")
    monkeypatch.setattr(answer, "agentic", lambda *a, **kw: SimpleNamespace(
        answer="", stop_reason=SimpleNamespace(value="error"), error=said))
    cli("ingest", str(docs), "--index", "support", "--retriever", "bm25")
    with FakeOpenAIServer([]) as server:
        env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}
        r = cli("ask", "Can I get a refund?", "--index", "support", "--k", "4", env=env)
    assert r.exit_code == 3, r.output
    assert "Limits.max_input_tokens" not in r.stderr
    assert "--k, now 4" in flat(r.stderr) and "--pipeline" in flat(r.stderr)
