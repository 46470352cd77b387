"""Contextual windows: MiniLM reads a long text once and pools each window from that pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from tether.rag._dense import DenseRetriever, embed_passages, split_windows
from tether.rag._encoder import EmbedderUnavailable, MiniLMEncoder, find_model_file, window_spans
from tether.rag._index import Index

SENTENCE = ("Library catalogues index books by subject headings, and readers search them by the words "
            "they expect the headings to use. ")
TOPICS = ["Zebras graze on the savanna in large herds.", "Compilers turn source code into machine code.",
          "Interest rates rise when inflation grows.", "Glaciers carve valleys over thousands of years."]


class CountingEncoder(MiniLMEncoder):
    """MiniLM that counts the tokens it runs through the graph."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokens = 0

    def _states(self, rows, session=None):
        self.tokens += sum(len(r) for r in rows)
        return super()._states(rows, session)


@pytest.fixture
def encoder() -> CountingEncoder:
    try:
        return CountingEncoder(find_model_file(), threads=1)
    except EmbedderUnavailable as exc:
        pytest.skip(str(exc))


def pooled(enc: MiniLMEncoder, ids: list[int], span: tuple[int, int]) -> np.ndarray:
    """The mean of the states of pieces span[0]:span[1] of `ids` run as one row, normalised."""
    states, _ = enc._states([[enc._cls, *ids, enc._sep]])
    v = states[0, span[0] + 1 : span[1] + 1].mean(axis=0)
    return v / np.linalg.norm(v)


def test_window_vectors_are_their_pieces_states_pooled_from_one_pass(encoder):
    text = SENTENCE * 8 + TOPICS[0]  # about 200 pieces: one pass, windows at 0, 63 and 126
    ids = encoder._piece_ids([text])[0]
    assert 126 < len(ids) <= 254
    vectors, windows, owner = embed_passages(encoder, ["a short text", text], 126, 63, offset=5)
    spans = window_spans(len(ids), 126, 63)
    assert len(spans) >= 2 and owner.tolist() == [6] * len(spans)
    assert np.allclose(windows, [pooled(encoder, ids, s) for s in spans], atol=1e-5)
    assert np.allclose(vectors, encoder.embed(["a short text", text]), atol=1e-5)  # its own: the whole text
    _, none, nobody = embed_passages(encoder, ["a short text"], 126, 63)
    assert none.shape == (0, 384) and len(nobody) == 0
    encoder.tokens = 0
    embed_passages(encoder, [text], 126, 63)
    assert encoder.tokens == len(ids) + 2  # read once, not once per window


def test_a_text_longer_than_the_model_reads_gets_windows_to_its_end(encoder):
    text = " ".join(SENTENCE + t for t in TOPICS) * 3  # about 350 pieces > 254: two passes
    ids = encoder._piece_ids([text])[0]
    assert len(ids) > 300
    _, windows, owner = embed_passages(encoder, [text], 126, 63)
    spans = window_spans(len(ids), 126, 63)
    assert len(windows) == len(spans) and spans[-1][1] == len(ids) and owner.tolist() == [0] * len(spans)
    # the last window lies in a later pass that starts where it is first needed: 189 (the 4th window)
    assert np.allclose(windows[-1], pooled(encoder, ids[189 : 189 + 254], (spans[-1][0] - 189, len(ids) - 189)),
                       atol=1e-5)
    # and means what its own text means, near enough
    own = encoder.embed(split_windows(encoder, text, 126, 63))
    assert float(own[-1] @ windows[-1]) > 0.8


def test_an_index_of_windows_embedded_as_texts_re_embeds_once(encoder, tmp_path):
    text = SENTENCE * 8 + TOPICS[1]
    with Index(tmp_path / "ix", retriever="dense", embedder=encoder) as idx:
        idx.add_text("long", text, markdown=False)
        idx.search("compilers", 1)
        dense = idx._dense()
        assert isinstance(dense, DenseRetriever) and dense.windows_key == "126:63:pass"
        idx._set_meta("vectors_windows", "126:63:first")  # what an index stored before
    encoder.tokens = 0
    with Index(tmp_path / "ix", retriever="dense", embedder=encoder) as idx:
        assert idx.search("compilers", 1)[0].source == "long"
        assert encoder.tokens > 100  # the passage again, not only the query
        assert idx._meta("vectors_windows") == "126:63:pass"
    encoder.tokens = 0
    with Index(tmp_path / "ix", retriever="dense", embedder=encoder) as idx:
        idx.search("compilers", 1)
        assert encoder.tokens < 10  # the query only


def test_windows_through_the_ingest_checkpoint_are_the_same(encoder, tmp_path):
    texts = [SENTENCE * 8 + TOPICS[2], "short", " ".join(SENTENCE + t for t in TOPICS) * 3]
    with Index(tmp_path / "ix", retriever="dense", embedder=encoder) as idx:
        idx.add_texts([(f"t{i}", t) for i, t in enumerate(texts)], markdown=False)
        idx.search("glaciers", 1)
        direct = embed_passages(encoder, [c.indexed_text for c in idx.chunks()], 126, 63)
        assert len(direct[2])
        stored = [np.load(next(Path(tmp_path / "ix").glob(f"{kind}*.npy"))) for kind in ("windows", "window_owner")]
    assert np.allclose(stored[0], direct[1], atol=1e-5) and stored[1].tolist() == direct[2].tolist()


def test_the_ingest_line_says_windows_are_pooled_not_embedded(encoder, tmp_path):
    said: list[str] = []
    with Index(tmp_path / "ix", retriever="dense", embedder=encoder, notify=said.append) as idx:
        idx.add_texts([("long", SENTENCE * 8 + TOPICS[0]), ("short", TOPICS[1])], markdown=False)
    line = next(s for s in said if "documents changed" in s)
    assert "2 passages to embed (their 3 window vectors pooled from the same pass)" in line, line
