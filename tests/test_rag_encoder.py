"""The MiniLM encoder: the int8 graph derived from the shipped one, its check, and batching."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from tether.rag import _encoder as enc_mod
from tether.rag import _encoder_path as path_mod
from tether.rag import _int8 as int8
from tether.rag._encoder import EmbedderUnavailable, MiniLMEncoder, find_model_file

DATA = next((p / "shared" / "data" / "cisi" / "corpus.jsonl" for p in Path(__file__).resolve().parents
             if (p / "shared" / "data" / "cisi" / "corpus.jsonl").exists()), None)  # from a worktree too
TEXTS = [
    "Refunds are issued within 30 days of the return.",
    "Can I get my money back?",
    "Parcels ship to Norway and Sweden within a week.",
    "The eighteenth edition of the Dewey Decimal Classification was published in 1971 " * 12,
    "x",
    "ok",
    "yes",
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
    assert fast.path is not None and fast.path.recipe in (path_mod.ROW8.name, path_mod.ROW7.name), fast.path
    assert fast.model_path.parent == cache / "models" and fast.path.recipe in fast.name
    ops = [n.op_type for n in onnx.load(str(fast.model_path)).graph.node]
    # the weight products of the 6 layers, scaled as onnxruntime writes them (no Cast, no Mul after)
    assert ops.count("MatMulIntegerToFloat") == 36 and "MatMulInteger" not in ops
    assert ops.count("MatMul") == 12  # attention's two products per layer stay float
    again = MiniLMEncoder()
    assert again.model_path == fast.model_path and again.path == fast.path  # decided once, then read back


def test_the_graph_the_decision_picks_for_accuracy_agrees_with_the_shipped_graph(source, cache, monkeypatch):
    # Speed aside (under an emulated CPU it means nothing), whatever graph this CPU computes exactly
    # must stay close to the float graph: per-token input scales keep every text within .99 and
    # abstracts within .997 on average (one scale per call had one letter at .975, abstracts .995).
    monkeypatch.setattr(path_mod, "MIN_SPEEDUP", 0.0)
    fast = MiniLMEncoder(threads=1)
    assert fast.path is not None and fast.path.recipe in (path_mod.ROW8.name, path_mod.ROW7.name), fast.path
    texts = TEXTS
    if DATA is not None:  # real abstracts of varied length, as in the bench
        texts = TEXTS + [json.loads(line)["text"] for line in DATA.read_text().splitlines()[:60]]
    slow = MiniLMEncoder(source, threads=1)
    cos = (fast.embed(texts) * slow.embed(texts)).sum(axis=1)
    assert cos.min() > enc_mod.MIN_CHECK_COSINE and cos.mean() > 0.997, (fast.path.recipe, cos)


def test_short_texts_are_embedded_by_the_float_graph_which_loads_only_when_one_comes(source, cache):
    # int8 loses most on texts of a few tokens ("x" at .9896 with the 7-bit graph): they run in float
    fast = MiniLMEncoder(threads=2)
    assert fast.float_path == source and f"float<={enc_mod.SHORT_TOKENS}" in fast.name
    assert f"texts of at most {enc_mod.SHORT_TOKENS} tokens: the float graph" in fast.path.line()  # type: ignore[union-attr]
    long_texts = TEXTS[:4]
    alone = fast.embed(long_texts)
    assert fast._float_session is None  # nothing short yet: no second session in memory
    slow = MiniLMEncoder(source, threads=1)
    int8_only = MiniLMEncoder(fast.model_path, threads=1)
    short = ["x", "ok", "a refund", "what is bm25"]
    assert all(len(e.ids) <= enc_mod.SHORT_TOKENS for e in fast._tok.encode_batch(short))
    mixed = fast.embed([short[0], *long_texts, *short[1:]])
    assert np.allclose(mixed[[0, 5, 6, 7]], slow.embed(short), atol=1e-5)
    assert np.allclose(mixed[1:5], alone, atol=1e-5) and np.allclose(alone, int8_only.embed(long_texts), atol=1e-5)
    assert fast._float_session is not None


def test_a_texts_vector_does_not_depend_on_the_texts_batched_with_it(source, tmp_path):
    # Each token's input has its own scale: an outlier text in the batch costs the others nothing
    # (with one scale per call, as before, a text's vector moved with its batch).
    graph = tmp_path / "r8.onnx"
    path_mod.ROW8.rewrite(source, graph)
    enc = MiniLMEncoder(graph, threads=1, batch_tokens=4096)
    alone = enc.embed(TEXTS[:3])
    odd = ["#### 0x7f3a9c " * 40, "ZZZZ " * 100]
    together = enc.embed(TEXTS[:3] + odd)
    assert np.abs(together[:3] - alone).max() < 1e-4


def _optimised(source: Path, tmp_path: Path) -> list[str]:
    """The op types of `source` as the encoder's session runs it (after onnxruntime's fusions)."""
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    enc_mod._session(ort, source, opts)
    return [n.op_type for n in onnx.load(str(tmp_path / "optimised.onnx")).graph.node]


def test_the_derived_graphs_gelu_is_fused_and_its_layer_norms_are_not(source, tmp_path):
    # the shipped GELU order, x * (0.5 * (1 + erf)), is one onnxruntime does not fuse (six passes over
    # tokens x 1536 a layer); reordered it runs as one BiasGelu. SkipLayerNormalization ran 4x slower
    # than the Add, Add and LayerNormalization it fuses: the session leaves them unfused
    graph = tmp_path / "r7.onnx"
    path_mod.ROW7.rewrite(source, graph)
    ops = _optimised(graph, tmp_path)
    assert "Erf" not in ops and ops.count("BiasGelu") == 6, sorted(set(ops))
    assert "SkipLayerNormalization" not in ops and ops.count("LayerNormalization") == 13, sorted(set(ops))


def test_the_7_bit_graph_multiplies_centred_inputs_symmetrically_and_never_above_127(source, tmp_path):
    # attention output and feed-forward in: inputs in 1..127 around a zero of 64 (no correction term
    # after the product); every uint8 input of every product stays <= 127, so 2 x 127 x 128 < 32768
    # and no pair of vpmaddubsw products can saturate on a CPU without VNNI
    import onnx
    import onnxruntime as ort

    graph = tmp_path / "r7.onnx"
    path_mod.ROW7.rewrite(source, graph)
    model = onnx.load(str(graph))
    products = [n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"]
    assert sum(n.input[4] == "tether_i8_64u" for n in products) == 12  # 2 of the 6 products in each layer
    assert sum(n.op_type == "Add" and n.name.endswith("__out") for n in model.graph.node) == 24  # their correction
    inputs = sorted({n.input[0] for n in products})
    model.graph.output.extend(onnx.helper.make_tensor_value_info(x, onnx.TensorProto.UINT8, None) for x in inputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    enc = MiniLMEncoder(source, threads=1)
    ids = np.array([enc._tok.encode("#### 0x7f3a9c ZZZZ " * 20 + TEXTS[3]).ids], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
    got = session.run(inputs, feeds)
    assert max(int(g.max()) for g in got) == 127 and min(int(g.min()) for g in got) == 0


def test_the_decision_is_remembered_per_cpu_and_not_measured_again(source, cache, monkeypatch):
    first = MiniLMEncoder().path
    assert first is not None and first.measured["float"]["ms_per_text"] > 0
    assert {first.recipe} <= set(first.measured), first.measured
    saved = list((cache / "models").glob("path-*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["recipe"] == first.recipe

    def measure_again(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(path_mod, "decide", measure_again)
    assert MiniLMEncoder().path == first
    monkeypatch.setattr(path_mod, "cpu_summary", lambda: ("another CPU; avx2", "another"))
    with pytest.raises(AssertionError, match="measured again"):  # another CPU (say, a moved cache) decides anew
        MiniLMEncoder()


def _saturating(recipe_name: str, monkeypatch) -> None:
    """Make the graph of `recipe_name` compute as a CPU that saturates would: wrong, but it runs."""
    real = int8.rewrite

    def rewrite(src: Path, target: Path, *, seven_bit_inputs: bool = False, **kw) -> int:
        import onnx
        from onnx import numpy_helper

        n = real(src, target, seven_bit_inputs=seven_bit_inputs, **kw)
        if (path_mod.ROW7.name if seven_bit_inputs else path_mod.ROW8.name) == recipe_name:
            model = onnx.load(str(target))
            for init in model.graph.initializer:
                if init.name.endswith("__scale"):  # off by a few percent, as clipped sums are
                    arr = numpy_helper.to_array(init)
                    init.CopyFrom(numpy_helper.from_array(arr * np.linspace(0.5, 1.5, arr.size, dtype=np.float32),
                                                          init.name))
            onnx.save(model, str(target))
        return n

    monkeypatch.setattr(int8, "rewrite", rewrite)


def test_a_cpu_whose_8_bit_products_are_not_exact_gets_the_7_bit_graph_and_is_told_why(source, cache, monkeypatch):
    monkeypatch.setattr(path_mod, "products_exact", lambda: False)  # as AVX2 without VNNI computes them
    chosen = MiniLMEncoder().path
    assert chosen is not None and chosen.recipe == path_mod.ROW7.name, chosen
    assert chosen.measured[path_mod.ROW8.name]["products_exact"] == 0.0
    assert "not exact here" in chosen.reason and "7-bit inputs" in chosen.line()


def test_the_product_probe_tells_a_clipping_cpu_from_an_exact_one(monkeypatch):
    import onnxruntime as ort
    from onnx import numpy_helper, onnx_pb

    assert path_mod.products_exact() in (True, False)  # this CPU: runs, either way

    class Clipping:  # multiplies as `vpmaddubsw` does (AVX2 without VNNI): pairs of terms clipped to 16 bits
        def __init__(self, model: bytes, *a, **k) -> None:
            m = onnx_pb.ModelProto()
            m.ParseFromString(model)
            self.w = numpy_helper.to_array(m.graph.initializer[0]).astype(np.int64)

        def run(self, _outputs, feeds):
            a = feeds["a"].astype(np.int64)
            pairs = a[:, 0::2, None] * self.w[None, 0::2, :] + a[:, 1::2, None] * self.w[None, 1::2, :]
            return [pairs.clip(-32768, 32767).sum(axis=1).astype(np.int32)]

    monkeypatch.setattr(ort, "InferenceSession", Clipping)
    assert path_mod.products_exact() is False


def test_no_cpu_falls_back_to_the_float_graph_silently(source, cache, monkeypatch):
    monkeypatch.setattr(path_mod, "products_exact", lambda: False)
    _saturating(path_mod.ROW7.name, monkeypatch)
    with pytest.warns(RuntimeWarning, match="SLOW PATH, no int8 graph is usable here"):
        chosen = MiniLMEncoder().path
    assert chosen is not None and chosen.recipe == "float" and Path(chosen.graph) == source
    assert "is not exact here" in chosen.reason and "is not right here" in chosen.reason, chosen.reason


def test_an_int8_graph_no_faster_than_float_is_not_used_and_that_is_said(source, cache, monkeypatch):
    monkeypatch.setattr(path_mod, "MIN_SPEEDUP", 1000.0)
    with pytest.warns(RuntimeWarning, match="only .*x the float graph's speed here"):
        assert MiniLMEncoder().path.recipe == "float"  # type: ignore[union-attr]


def test_the_more_precise_graph_is_kept_unless_the_other_is_clearly_faster(source, cache, monkeypatch):
    """Both candidates run the same integer kernels: a gap of a few percent is timing noise on a busy
    machine and must not flip the choice (and with it every index's vector key) between runs."""
    if not path_mod.products_exact():
        pytest.skip("the 8-bit-input graph is refused on this CPU (no VNNI): nothing to choose between")
    measure = path_mod._measure
    ms = {"float": 20.0, path_mod.ROW8.name: 5.0, path_mod.ROW7.name: 4.4}  # 7-bit 12% faster: noise

    def timed(encoder, graph, texts):
        vectors, m = measure(encoder, graph, texts)
        return vectors, {**m, "ms_per_text": next((v for k, v in ms.items() if f"-{k}-" in Path(graph).name),
                                                  ms["float"])}

    monkeypatch.setattr(path_mod, "_measure", timed)
    assert MiniLMEncoder().path.recipe == path_mod.ROW8.name  # type: ignore[union-attr]
    ms[path_mod.ROW7.name] = 3.0  # 40% faster: worth the bit of precision
    for decision in cache.rglob("path-*.json"):
        decision.unlink()
    assert MiniLMEncoder().path.recipe == path_mod.ROW7.name  # type: ignore[union-attr]


def test_the_shipped_check_vectors_are_the_shipped_graphs(source):
    import hashlib

    with np.load(enc_mod.CHECK_VECTORS) as stored:
        assert str(stored["digest"]) == hashlib.sha256(source.read_bytes()).hexdigest()[:16]
        again = MiniLMEncoder(source, threads=1).embed(enc_mod.CHECK_TEXTS)
        assert np.allclose(stored["vectors"], again, atol=1e-5)
        exact = {r.name: stored[f"int8_{r.name}"] for r in path_mod.CANDIDATES}
    import tempfile
    from dataclasses import replace

    with tempfile.TemporaryDirectory() as tmp:  # recipes that compute exactly on every x86 CPU
        for recipe in (replace(path_mod.ROW8, unsigned=True), path_mod.ROW7):
            assert path_mod.cannot_saturate(recipe)
            made = Path(tmp) / "g.onnx"
            recipe.rewrite(source, made)
            got = MiniLMEncoder(made, threads=1).embed(enc_mod.CHECK_TEXTS)
            name = recipe.name
            assert (got * exact[name]).sum(axis=1).min() >= path_mod.EXACT_COSINE, name


def test_opting_out_or_no_onnx_keeps_the_shipped_graph(source, cache, monkeypatch):
    monkeypatch.setenv("TETHER_EMBED_INT8", "0")
    assert MiniLMEncoder().model_path == source
    monkeypatch.delenv("TETHER_EMBED_INT8")
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.warns(RuntimeWarning, match="could not be made"):
        chosen = MiniLMEncoder()
    assert chosen.model_path == source and chosen.path is not None and "could not be made" in chosen.path.reason


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


def test_ingest_says_first_which_graph_embeds_here_and_doctor_says_the_same(source, cache, tmp_path, monkeypatch):
    from rag_fakes import rag_cli

    from tether.cli._doctor_cmd import encoder_check

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Refunds\n\nRefunds are issued within 30 days of the return.\n")
    r = rag_cli(monkeypatch, tmp_path)("ingest", str(docs), "--index", "kb")
    assert r.exit_code == 0, r.stderr
    first = " ".join(r.stderr.split("tether: ")[1].split())  # the first message, unwrapped
    assert first.startswith("encoder: int8 (") and "on this CPU (" in first and "the float graph's speed" in first
    assert "texts of at most 8 tokens: the float graph" in first
    shown = encoder_check(probe=False)
    assert shown.state == "ok" and " ".join(shown.detail.split()) in first, (shown, first)
