"""examples/support_rag: the stemming question finds the refund policy, and an uncovered
question gets "the passages do not say", in pipeline and agentic mode."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from tether._types import ModelReply, ModelRequest
from tether.models._base import stream_by_completing
from tether.models._scripted import ScriptedModel, call
from tether.rag._answer import agentic, pipeline
from tether.rag._prompt import NO_ANSWER
from tether.rag._text import stemmed_tokens, word_tokens

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "support_rag"
REFUND_Q = "Can I get a refund after 30 days?"
UNCOVERED_Q = "What is the warranty on laptops?"
QUESTION_WORDS = {"can", "get", "what", "how", "do", "you", "my", "which", "when", "where"}


def load_example():
    spec = importlib.util.spec_from_file_location("support_rag_run", EXAMPLE / "run.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def passages_in(text: str) -> dict[int, str]:
    """Numbered passages from a pipeline prompt or a search-tool result: number -> body text.

    A passage starts at a line "[n] ..." and runs to the next blank line before another passage,
    the question, or the end of an untrusted-data wrapper."""
    out: dict[int, str] = {}
    for m in re.finditer(r"^\[(\d+)\][^\n]*\n(.*?)(?=\n\n\[\d+\]|\n\nQuestion:|\n</untrusted-data>|\Z)", text, re.S | re.M):
        body = "\n".join(line for line in m.group(2).splitlines() if not line.startswith("section: "))
        out[int(m.group(1))] = body
    return out


def extractive_answer(question: str, material: str) -> str:
    """Answer with the passage sentence sharing the most content stems with the question, citing it;
    fewer than two shared stems means the passages do not answer."""
    want = set(stemmed_tokens(question)) - QUESTION_WORDS
    best, best_n, best_overlap = "", 0, 0
    for n, body in passages_in(material).items():
        for sentence in re.split(r"(?<=[.!?])\s+", body):
            overlap = len(want & set(stemmed_tokens(sentence)))
            if overlap > best_overlap:
                best, best_n, best_overlap = sentence.strip(), n, overlap
    return f"{best} [{best_n}]" if best_overlap >= 2 else f"{NO_ANSWER.capitalize()}."


class ExtractiveModel:
    """A tiny offline reader standing in for an LLM in pipeline mode; it sees only the prompt."""

    name = "extractive"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        prompt = request.messages[-1].content
        question = prompt.rsplit("Question:", 1)[1].split("\n")[0]
        return ModelReply(extractive_answer(question, prompt))

    def stream(self, request: ModelRequest):
        return stream_by_completing(self, request)


@pytest.fixture(scope="module", params=["bm25", "best"])
def index(request, tmp_path_factory):
    embedder = None
    if request.param == "best":
        from tether.rag._encoder import EmbedderUnavailable, MiniLMEncoder

        try:
            embedder = MiniLMEncoder()
        except (EmbedderUnavailable, ImportError) as exc:
            pytest.skip(str(exc))
    idx = load_example().build_index(tmp_path_factory.mktemp("ix"), retriever=request.param, embedder=embedder)
    yield idx
    idx.close()


def test_refund_question_finds_the_refund_policy_through_stemming(index):
    body = (EXAMPLE / "docs" / "refunds.md").read_text()
    assert "refund" not in word_tokens(body) and "refunds" in word_tokens(body)  # only the plural is written
    hits = index.search(REFUND_Q, 3)
    assert hits[0].source.endswith("refunds.md")
    assert "30" in hits[0].text and "refunds" in hits[0].text.lower()


def test_pipeline_answers_with_a_citation_and_admits_what_is_not_there(index):
    model = ExtractiveModel()
    out = pipeline(REFUND_Q, index, model, k=3)
    assert re.search(r"\[\d\]$", out.answer)
    cited = int(out.answer[-2])
    assert out.hits[cited - 1].source.endswith("refunds.md") and "refunds" in out.answer.lower()
    assert model.requests[0].tools == [] and NO_ANSWER in model.requests[0].messages[0].content

    uncovered = pipeline(UNCOVERED_Q, index, model, k=3)
    # dense ranks every passage, none covers the question; BM25 returns none: none shares a term with it
    assert len(uncovered.hits) == (0 if index.retriever_name == "bm25" else 3)
    assert uncovered.answer.lower().startswith(NO_ANSWER)


def test_agentic_mode_calls_search_then_answers_from_its_result(index):
    def script(request: ModelRequest):
        tool_msgs = [m for m in request.messages if m.role == "tool"]
        question = next(m.content for m in request.messages if m.role == "user")
        if not tool_msgs:
            return call("search", query=question, k=3)
        return extractive_answer(question, tool_msgs[-1].content)

    model = ScriptedModel(script)
    result = agentic(REFUND_Q, index, model)
    assert result.completed and re.search(r"refunds .*\[\d\]$", result.answer.lower())
    assert "search" in [s.name for s in model.requests[0].tools]
    assert "[1] id=" in next(m.content for m in model.requests[1].messages if m.role == "tool")

    result = agentic(UNCOVERED_Q, index, ScriptedModel(script))
    assert result.completed and result.answer.lower().startswith(NO_ANSWER)
