"""The search tool: metadata, shaping, capping, and a run through the executor."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("bm25s")

from tether._limits import Limits
from tether._types import Effect
from tether.rag._base import Hit
from tether.rag._index import Index
from tether.rag._prompt import NO_ANSWER, build_messages, clip, format_passages
from tether.rag._tool import search_tool, shape_hits


class FixedHits:
    """A searchable that returns preset hits and records the k it was asked for."""

    def __init__(self, hits: list[Hit]) -> None:
        self.hits = hits
        self.asked: list[tuple[str, int]] = []

    def search(self, query: str, k: int = 5) -> list[Hit]:
        self.asked.append((query, k))
        return self.hits[:k]


def hit(n: int, text: str = "some text", heading: str = "") -> Hit:
    return Hit(n, 1.0 / (n + 1), f"id{n}", f"/docs/file{n}.md", heading, text)


def test_tool_metadata_marks_output_untrusted_and_read_only():
    t = search_tool(FixedHits([]), max_k=8)
    assert t.name == "search" and t.effect is Effect.READ_ONLY and t.untrusted_output is True
    props = t.parameters["properties"]
    assert set(props) == {"query", "k"} and props["k"]["maximum"] == 8 and props["k"]["default"] == 5
    assert t.parameters["required"] == ["query"]


def test_results_carry_number_id_source_section_and_score():
    out = shape_hits([hit(0, "Refunds within 30 days.", "Refunds"), hit(1, "Ships fast.")])
    assert out.splitlines()[:3] == [
        "[1] id=id0 source=/docs/file0.md score=1.000",
        "section: Refunds",
        "Refunds within 30 days.",
    ]
    assert "[2] id=id1 source=/docs/file1.md score=0.500\nShips fast." in out


def test_each_passage_is_clipped_and_the_whole_result_capped():
    long = " ".join(["word"] * 500)  # 2,499 characters
    out = shape_hits([hit(i, long) for i in range(10)], passage_chars=300, max_chars=1000)
    assert len(out) <= 1000 + 80
    blocks = out.split("\n\n")
    assert all(len(b.splitlines()[-1]) <= 300 for b in blocks[:-1])
    assert blocks[0].splitlines()[-1].endswith("…")
    assert blocks[-1].startswith("(") and "more passages not shown" in blocks[-1]
    shown = sum(1 for b in blocks if b.startswith("["))
    assert blocks[-1].startswith(f"({10 - shown} more")


def test_a_single_oversized_passage_still_fits_the_cap():
    out = shape_hits([hit(0, "x" * 5000, "H" * 50)], passage_chars=4000, max_chars=500)
    assert len(out) <= 500


def test_no_hits_says_so():
    assert shape_hits([]) == "No passages matched the query."


def test_the_tool_validates_arguments_and_passes_k():
    src = FixedHits([hit(i) for i in range(10)])
    t = search_tool(src, default_k=3, max_k=5)
    args = t.validator.validate({"query": "refunds"})
    assert args == {"query": "refunds", "k": 3}
    t.fn(**args)
    assert src.asked == [("refunds", 3)]
    for bad in ({"query": "x", "k": 6}, {"query": ""}, {"k": 2}):
        with pytest.raises(Exception):  # noqa: B017 - the schema layer's own error type
            t.validator.validate(bad)


def test_tool_runs_through_the_executor_on_a_real_index(tmp_path):
    from tether._types import ToolCall
    from tether.tools._executor import CallContext, Executor

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.md").write_text("# Refunds\nRefunds are issued within 30 days.\n")
    (tmp_path / "d" / "b.md").write_text("# Shipping\nParcels ship in 3 days.\n")
    idx = Index(tmp_path / "ix", retriever="bm25")
    idx.ingest(tmp_path / "d")
    ex = Executor([search_tool(idx)])
    result = asyncio.run(ex.execute(ToolCall("c1", "search", {"query": "refund", "k": 1}), CallContext(run_id="r1")))
    assert not result.is_error
    assert "[1] id=" in result.content and "Refunds are issued" in result.content
    assert "Parcels" not in result.content


def test_prompt_numbers_passages_and_states_the_rules():
    msgs = build_messages("Can I get a refund?", [hit(0, "Refunds within 30 days.", "Refunds"), hit(1, "Ships.")])
    system, user = msgs[0].content, msgs[1].content
    assert msgs[0].role == "system" and msgs[1].role == "user"
    assert "only" in system and NO_ANSWER in system and "[2]" in system
    assert "[1] source: /docs/file0.md | section: Refunds\nRefunds within 30 days." in user
    assert "[2] source: /docs/file1.md\nShips." in user
    assert user.rstrip().endswith(f'say "{NO_ANSWER}."') and "Question: Can I get a refund?" in user
    assert "(no passages were found)" in build_messages("q", [])[1].content


def test_clip_cuts_at_a_word_boundary():
    assert clip("alpha beta gamma delta", 14) == "alpha beta…"
    assert clip("short", 14) == "short"
    assert format_passages([hit(0, "a " * 100)], passage_chars=20).endswith("…")


def test_agentic_answering_keeps_every_request_within_the_models_window():
    """A small window (the embedded model's 4,096 tokens, here 1,500): earlier searches are folded
    so that no request outgrows it (before: the transcript grew by every search until the model
    refused it)."""
    from tether._tokens import EstimateCounter, message_tokens
    from tether._types import ModelReply, ToolCall
    from tether.models._scripted import ScriptedModel
    from tether.rag._answer import agentic

    class Long:
        def search(self, query, k=5):
            return [Hit(i, 1.0 - i / 10, f"c{query}{i}", f"doc{i}.md", "", f"{query} passage {i} " + "filler words " * 60)
                    for i in range(k)]

    searches = iter(range(100))

    def reply(request):
        if not request.tools:  # the compactor's summary call
            return ModelReply(text="- searched earlier; found long passages")
        n = next(searches)
        if n < 6:
            return ModelReply(tool_calls=[ToolCall(f"s{n}", "search", {"query": f"topic{n}"})])
        return ModelReply(text="Done [1].")

    model = ScriptedModel(reply)
    model.context_window = 1500  # type: ignore[attr-defined]
    result = agentic("What do the documents say?", Long(), model, k=3, limits=Limits(max_steps=10))
    assert result.answer == "Done [1].", result
    counter = EstimateCounter()
    sizes = [sum(message_tokens(counter, m) for m in r.messages) for r in model.requests if r.tools]
    assert len(sizes) == 7 and max(sizes) <= 1500, sizes


def test_pipeline_leaves_out_passages_that_would_not_fit_the_window():
    from tether._tokens import EstimateCounter, message_tokens
    from tether.models._scripted import ScriptedModel
    from tether.rag._answer import pipeline

    class Long:
        def search(self, query, k=5):
            return [Hit(i, 1.0, f"c{i}", f"doc{i}.md", "", f"passage {i} " + "filler words " * 80) for i in range(k)]

    model = ScriptedModel(["From [1]."])
    model.context_window = 1500  # type: ignore[attr-defined]
    out = pipeline("What do they say?", Long(), model, k=20)
    sent = sum(message_tokens(EstimateCounter(), m) for m in model.requests[0].messages)
    assert out.answer == "From [1]." and 1 <= len(out.hits) < 20 and sent + 512 <= 1500, (len(out.hits), sent)
