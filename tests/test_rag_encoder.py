"""The MiniLM encoder: the int8 graph derived from the shipped one, its check, and batching."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from tether.rag import _encoder as enc_mod
from tether.rag import _int8 as int8
from tether.rag._encoder import EmbedderUnavailable, MiniLMEncoder, find_model_file

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cisi" / "corpus.jsonl"
TEXTS = [
    "Refunds are issued within 30 days of the return.",
    "Can I get my money back?",
    "Parcels ship to Norway and Sweden within a week.",
    "The eighteenth edition of the Dewey Decimal Classification was published in 1971 " * 12,
    "x",
]


@pytest.fixture
def source() -> Path:
    try:
        return find_model_file()
    except EmbedderUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TETHER_EMBED_MODEL", raising=False)
    monkeypatch.delenv("TETHER_EMBED_INT8", raising=False)
    return tmp_path / "cache"


def test_the_default_encoder_computes_in_int8_and_agrees_with_the_shipped_graph(source, cache):
    import onnx

    fast = MiniLMEncoder()
    assert fast.model_path.parent == cache / "models" and "int8mm" in fast.name
    ops = [n.op_type for n in onnx.load(str(fast.model_path)).graph.node]
    assert ops.count("DynamicQuantizeMatMul") == 36  # every weight product of the 6 layers
    assert ops.count("MatMul") == 12  # what is left in float: attention's two products per layer
    texts = TEXTS
    if DATA.exists():  # real abstracts of varied length, as in the bench
        texts = TEXTS + [json.loads(line)["text"] for line in DATA.read_text().splitlines()[:60]]
    slow = MiniLMEncoder(source)
    cos = (fast.embed(texts) * slow.embed(texts)).sum(axis=1)
    assert cos.min() > enc_mod.MIN_CHECK_COSINE and cos.mean() > 0.99, cos  # one letter: .975; abstracts .99+
    assert MiniLMEncoder().model_path == fast.model_path  # derived once, then reused


def test_a_derived_graph_that_disagrees_is_not_used(source, cache, monkeypatch):
    real = int8.rewrite

    def scrambled(src: Path, target: Path) -> int:
        import onnx
        from onnx import numpy_helper

        n = real(src, target)
        model = onnx.load(str(target))
        for init in model.graph.initializer:
            if init.name.endswith("__scale"):  # wrong scales: a graph that runs but computes nonsense
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[::-1].copy(), init.name))
        onnx.save(model, str(target))
        return n

    monkeypatch.setattr(int8, "rewrite", scrambled)
    with pytest.warns(RuntimeWarning, match="disagrees with the shipped one"):
        assert enc_mod.int8_model(source) is None
    with pytest.warns(RuntimeWarning, match="disagrees"):
        assert MiniLMEncoder().model_path == source  # the shipped graph, slower but right
    assert not list((cache / "models").glob("*.onnx"))  # nothing wrong left for the next run


def test_the_shipped_check_vectors_are_the_shipped_graphs(source):
    import hashlib

    with np.load(enc_mod.CHECK_VECTORS) as stored:
        assert str(stored["digest"]) == hashlib.sha256(source.read_bytes()).hexdigest()[:16]
        again = MiniLMEncoder(source, threads=1).embed(enc_mod.CHECK_TEXTS)
        assert np.allclose(stored["vectors"], again, atol=1e-5)


def test_opting_out_or_no_onnx_keeps_the_shipped_graph(source, cache, monkeypatch):
    monkeypatch.setenv("TETHER_EMBED_INT8", "0")
    assert MiniLMEncoder().model_path == source
    monkeypatch.delenv("TETHER_EMBED_INT8")
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.warns(RuntimeWarning, match="could not be made"):
        assert enc_mod.int8_model(source) is None
        assert MiniLMEncoder().model_path == source


def test_batches_hold_at_most_the_token_budget_and_do_not_change_vectors(source, cache):
    e = MiniLMEncoder(source, batch_tokens=300, threads=2)
    lengths = np.array([len(x.ids) for x in e._tok.encode_batch(TEXTS * 7)])
    batches = e._batches(lengths)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    assert all(len(b) * lengths[b].max() <= 300 or len(b) == 1 for b in batches)
    together = e.embed(TEXTS * 7)
    alone = np.stack([MiniLMEncoder(source, threads=1).embed([t])[0] for t in TEXTS])
    assert np.allclose(together[: len(TEXTS)], alone, atol=1e-4)
    assert np.allclose(together[len(TEXTS) :], np.tile(alone, (6, 1)), atol=1e-4)
    assert e.embed([]).shape == (0, 384)
