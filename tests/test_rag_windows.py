"""Multi-vector dense documents: max over whole-text and window vectors, and their persistence."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from rag_fakes import stored_array

from tether.rag._dense import DenseRetriever, split_windows
from tether.rag._index import Index


class TruncatingEmbedder:
    """One-hot bag of words over the first `max_words` words only, like a model with a length
    limit; counts the texts it embedded. Has no `piece_offsets`, so windows count words."""

    dim = 256

    def __init__(self, max_words: int = 50, name: str = "trunc-50") -> None:
        self.max_words = max_words
        self.name = name
        self.vocab: dict[str, int] = {}
        self.texts = 0

    def embed(self, texts):
        self.texts += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split()[: self.max_words]:
                out[i, self.vocab.setdefault(w, len(self.vocab)) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1)


def filler(n: int, start: int = 0) -> str:
    return " ".join(f"f{i}" for i in range(start, start + n))


LONG = filler(100) + " zebra stripes"  # the relevant words sit past the 50-word truncation
SHORT = "zebra " + filler(20, start=500)  # mentions zebra among many other words
OTHER = filler(30, start=900)


def test_windows_cover_the_text_with_overlap():
    emb = TruncatingEmbedder()
    assert split_windows(emb, "a b c", 4, 2) == []  # fits in one window: no windows
    assert split_windows(emb, "a b c d e f g", 4, 2) == ["a b c d", "c d e f", "e f g"]
    assert split_windows(emb, "a b c d e f g", 0, 2) == []


def test_relevant_end_of_a_long_text_is_found_through_its_windows():
    texts = [OTHER, SHORT, LONG]
    whole = DenseRetriever(TruncatingEmbedder(), window=0)
    whole.fit(texts)
    assert whole.scores("zebra stripes")[2] == 0.0  # truncation hides the end of LONG
    assert whole.search("zebra stripes", 1)[0][0] == 1
    windowed = DenseRetriever(TruncatingEmbedder(), window=40, stride=20)
    windowed.fit(texts)
    assert set(windowed.window_owner.tolist()) == {2}  # only the long text is split
    assert windowed.search("zebra stripes", 3)[0][0] == 2
    # the score is exactly the best of the whole-text vector and the window vectors
    emb = windowed.embedder
    q = emb.embed(["zebra stripes"])[0]
    parts = [LONG, *split_windows(emb, LONG, 40, 20)]
    assert windowed.scores("zebra stripes")[2] == pytest.approx(float(np.max(emb.embed(parts) @ q)))


def reference_scores(vectors, windows, owner, q):
    out = vectors @ q
    for row, v in zip(owner, windows, strict=True):
        out[row] = max(out[row], float(v @ q))
    return out


def unit(rng, n, dim=16):
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_vectorised_max_matches_a_loop_brute_force_and_ivf():
    rng = np.random.default_rng(0)
    vectors, windows = unit(rng, 400), unit(rng, 900)
    owner = np.sort(rng.choice(np.arange(0, 400, 3), 900))  # some passages have none
    d = DenseRetriever(TruncatingEmbedder())
    d.set_vectors(vectors, windows=windows, owner=owner)
    for q in unit(rng, 5):
        assert np.allclose(d.scores_for(q), reference_scores(vectors, windows, owner, q), atol=1e-6)
    ivf = DenseRetriever(TruncatingEmbedder(), ann_threshold=100)
    ivf.set_vectors(vectors, windows=windows, owner=owner)
    assert ivf.ivf is not None  # IVF partitions the whole-text vectors; windows ride along
    for q in unit(rng, 5):
        rows, part = ivf._scored(q)
        assert rows is not None and len(rows) < 400
        assert np.allclose(part, reference_scores(vectors, windows, owner, q)[rows], atol=1e-6)


def test_bad_owners_are_rejected():
    rng = np.random.default_rng(1)
    d = DenseRetriever(TruncatingEmbedder())
    with pytest.raises(ValueError, match="ascending"):
        d.set_vectors(unit(rng, 3), windows=unit(rng, 2), owner=np.array([2, 1]))
    with pytest.raises(ValueError, match="owners"):
        d.set_vectors(unit(rng, 3), windows=unit(rng, 2), owner=np.array([1]))
    with pytest.raises(ValueError, match="stride"):
        DenseRetriever(window=10, stride=0)


def open_index(path, emb, **kw):
    # chunks of up to 200 words: LONG (102 words) is one chunk with windows of 40 words
    return Index(path, retriever="dense", embedder=emb, **kw)


def test_windows_persist_and_reopening_does_not_re_embed(tmp_path):
    emb = TruncatingEmbedder()
    with open_index(tmp_path / "ix", emb, window=40, stride=20) as idx:
        idx.add_text("long", LONG, markdown=False)
        idx.add_text("short", SHORT, markdown=False)
        first = idx.search("zebra stripes", 2)
        assert first[0].source == "long"
        stored = stored_array(tmp_path / "ix", "windows")
        owner = stored_array(tmp_path / "ix", "window_owner")
        assert len(stored) == 5 and owner.tolist() == [0] * 5  # 102 words: windows at 0, 20, 40, 60, 80
    again = TruncatingEmbedder()
    again.vocab = dict(emb.vocab)  # same "model"
    with open_index(tmp_path / "ix", again) as idx:  # window settings remembered by the index
        assert (idx.window, idx.stride) == (40, 20)
        assert [(h.id, h.score) for h in idx.search("zebra stripes", 2)] == [(h.id, h.score) for h in first]
        assert again.texts == 1  # the query only
        dense = idx._retriever
        assert isinstance(dense, DenseRetriever) and isinstance(dense.window_vectors, np.memmap)


def test_windows_follow_their_chunks_through_incremental_changes(tmp_path):
    emb = TruncatingEmbedder()
    with open_index(tmp_path / "ix", emb, window=40, stride=20) as idx:
        idx.add_text("a", LONG, markdown=False)
        idx.add_text("b", SHORT, markdown=False)
        idx.add_text("c", filler(60, start=2000) + " okapi", markdown=False)
        idx.remove("a")  # a third of the slots dead: compacted, c's windows must now belong to slot 1
        before = emb.texts
        hits = idx.search("okapi", 1)
        assert emb.texts == before + 1 and hits[0].source == "c"
        owner = stored_array(tmp_path / "ix", "window_owner")
        windows = stored_array(tmp_path / "ix", "windows")
        assert owner.tolist() == [1, 1, 1]  # 61 words: windows at 0, 20, 40
        expected = emb.embed(split_windows(emb, idx.chunks()[1].indexed_text, 40, 20))
        assert np.allclose(windows, expected)


def test_a_windowed_text_is_embedded_only_as_its_windows_and_its_vector_is_its_first():
    from tether.rag._dense import embed_passages

    emb = TruncatingEmbedder()
    vectors, windows, owner = embed_passages(emb, [SHORT, LONG, OTHER], window=40, stride=20, offset=7)
    assert emb.texts == 2 + 5  # SHORT and OTHER whole; LONG (102 words) as windows at 0, 20, 40, 60, 80
    assert owner.tolist() == [8] * 5
    assert np.allclose(vectors[1], windows[0]) and np.allclose(windows[0], emb.embed([filler(40)])[0])
    assert np.allclose(vectors[[0, 2]], emb.embed([SHORT, OTHER]))


def test_other_window_scheme_or_damaged_owner_file_re_embeds(tmp_path):
    emb = TruncatingEmbedder()
    with open_index(tmp_path / "ix", emb, window=40, stride=20) as idx:
        idx.add_text("long", LONG, markdown=False)
        idx.search("zebra", 1)
    with open_index(tmp_path / "ix", emb, window=30, stride=30) as idx:
        before = emb.texts
        idx.search("zebra", 1)
        assert emb.texts - before == 1 + 4  # query, 4 windows of 30 (0, 30, 60, 90); no whole-text pass
        assert stored_array(tmp_path / "ix", "window_owner").tolist() == [0] * 4
    [owner_file] = (tmp_path / "ix").glob("window_owner*.npy")
    np.save(owner_file, np.array([0, 0], dtype=np.int64))  # out of step
    with open_index(tmp_path / "ix", emb) as idx:
        before = emb.texts
        idx.search("zebra", 1)
        assert emb.texts - before == 1 + 4
    with open_index(tmp_path / "ix", emb, window=0) as idx:  # windows off: one vector per chunk
        idx.search("zebra", 1)
        assert len(stored_array(tmp_path / "ix", "windows")) == 0
        with pytest.raises(ValueError, match="stride"):
            Index(tmp_path / "iy", window=10, stride=11)


def test_count_windows_counts_what_split_windows_makes():
    from tether.rag._dense import count_windows

    emb = TruncatingEmbedder()
    texts = [filler(n) for n in (0, 1, 39, 40, 41, 59, 60, 61, 100, 333)]
    for window, stride in ((40, 20), (40, 40), (40, 7), (1, 1), (0, 5)):
        made = sum(len(split_windows(emb, t, window, stride)) for t in texts)
        assert count_windows(emb, texts, window, stride) == made, (window, stride)
