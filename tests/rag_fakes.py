"""Test doubles for retrieval tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tether.rag._text import simple_tokens


class BagEmbedder:
    """A deterministic stand-in embedder: hashed bag of simple tokens, L2-normalised. Counts its
    calls and the texts it embedded (to prove an index was reopened without re-embedding)."""

    name = "bag-64"
    dim = 64

    def __init__(self) -> None:
        self.calls = 0
        self.texts = 0

    def embed(self, texts):
        self.calls += 1
        self.texts += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for tok in simple_tokens(t):
                out[i, sum(map(ord, tok)) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1)


def tiny_cross_encoder(path):
    """input_ids -> embedding lookup -> mean -> one logit: scores pairs that share the token
    "gamma" higher (its embedding row is 1, every other row 0)."""
    import pytest

    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from tokenizers.implementations import BertWordPieceTokenizer

    from tether.rag._encoder import VOCAB_PATH

    vocab = BertWordPieceTokenizer(str(VOCAB_PATH)).get_vocab()
    table = np.zeros((len(vocab), 1), dtype=np.float32)
    table[vocab["gamma"]] = 1.0
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["emb"], axis=0),
         helper.make_node("ReduceSum", ["emb", "axes"], ["logits"], keepdims=0)],
        "tiny", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "l"]),
                 helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "l"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 1])],
        [helper.make_tensor("table", TensorProto.FLOAT, table.shape, table.flatten()),
         helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "TETHER_", "ANTHROPIC_")


def rag_cli(monkeypatch: Any, tmp_path: Path) -> Callable[..., Any]:
    """`tether` in process (typer's runner) with no model configured and a private TETHER_HOME:
    `invoke("ingest", ...)` returns the runner's result."""
    import os

    from typer.testing import CliRunner

    from tether.cli._app import app

    for k in list(os.environ):
        if k.startswith(PROVIDER_VARS):
            monkeypatch.delenv(k)
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
        return runner.invoke(app, list(args), env=env, catch_exceptions=False)

    return invoke


def stored_array(index_dir: Path, kind: str) -> np.ndarray:
    """An index's stored `vectors`, `windows` or `window_owner` (one row per slot; a compaction or a
    whole rewrite writes the next epoch's file), as many rows as the index says it keeps."""
    import sqlite3

    with sqlite3.connect(index_dir / "index.sqlite") as db:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    epoch = meta.get("vectors_epoch", "0")
    arr = np.load(index_dir / (f"{kind}.npy" if epoch == "0" else f"{kind}.{epoch}.npy"))
    return arr[: int(meta["vectors" if kind == "vectors" else "windows"])]
