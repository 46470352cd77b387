"""Dense retrieval: cosine over sentence embeddings, brute force or IVF when the store is large.

A text longer than `window` word pieces also gets vectors for overlapping windows of `window`
pieces (stride `stride`), and scores as the best of its whole-text vector and its window vectors
(MaxP). MiniLM reads at most 256 pieces and was trained on 128, so without windows the end of a
long text is invisible and its middle diluted. 126 pieces (128 with [CLS] and [SEP]) was chosen
on CISI over 254; whether `best` uses windows at all is chosen across collections (rag/settings.py).
With MiniLM the windows are contextual: each is the mean of its pieces' token states in one pass
over the text (MiniLMEncoder.embed_with_windows), so no piece is read twice; an embedder without
token states embeds each window as a text of its own.
Optional Rocchio feedback moves the query vector towards its top passages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tether._errors import InvalidInput, OperationFailed
from tether.rag._ann import Candidates, IVFIndex
from tether.rag._base import top_k
from tether.rag._encoder import Embedder, MiniLMEncoder, window_spans

# Above this many vectors, search probes an IVF partition instead of scanning every vector.
ANN_THRESHOLD = 50_000
WINDOW = 126  # word pieces per window; 0 turns windows off
STRIDE = 63

_WORD = re.compile(r"\S+")


@dataclass(frozen=True, slots=True)
class Rocchio:
    """Rocchio pseudo-relevance feedback on the query vector: q' = q + beta * mean of the
    whole-text vectors of the `docs` best first-pass passages, renormalised."""

    docs: int = 10
    beta: float = 0.5


def piece_offsets(embedder: Embedder, text: str) -> list[tuple[int, int]]:
    """Character spans of the text's word pieces: the embedder's own (`piece_offsets`) when it
    has them, else whitespace-separated words."""
    own: Callable[[str], Iterable[tuple[int, int]]] | None = getattr(embedder, "piece_offsets", None)
    if callable(own):
        return list(own(text))
    return [m.span() for m in _WORD.finditer(text)]


def contextual(embedder: Embedder | type) -> bool:
    """Whether the embedder makes window vectors from one pass over a text (`embed_with_windows`)."""
    return callable(getattr(embedder, "embed_with_windows", None))


def split_windows(embedder: Embedder, text: str, window: int, stride: int) -> list[str]:
    """Overlapping windows of `window` pieces every `stride` pieces, or [] when the text fits in one."""
    if window <= 0:
        return []
    offs = piece_offsets(embedder, text)
    return [text[offs[s][0] : offs[e - 1][1]] for s, e in window_spans(len(offs), window, stride)]


def has_windows(embedder: Embedder, text: str, window: int) -> bool:
    """Whether `text` gets windows (is longer than `window` pieces)."""
    return window > 0 and len(piece_offsets(embedder, text)) > window


def count_windows(embedder: Embedder, texts: Sequence[str], window: int, stride: int) -> int:
    """How many windows `split_windows` makes of `texts` (without making them)."""
    if window <= 0:
        return 0
    total = 0
    for t in texts:
        n = len(piece_offsets(embedder, t))
        total += 0 if n <= window else 1 + -(-(n - window) // stride)
    return total


def window_pieces(embedder: Embedder, texts: Sequence[str], window: int, stride: int,
                  offset: int = 0) -> tuple[list[str], list[int]]:
    """The windows of every text (see `split_windows`) and, for each, its text's index plus `offset`."""
    pieces: list[str] = []
    owner: list[int] = []
    for i, t in enumerate(texts, offset):
        ws = split_windows(embedder, t, window, stride)
        pieces += ws
        owner += [i] * len(ws)
    return pieces, owner


def embed_passages(embedder: Embedder, texts: Sequence[str], window: int = WINDOW, stride: int = STRIDE,
                   offset: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One vector per text, the window vectors of texts longer than `window` pieces, and the text
    each window belongs to (plus `offset`, ascending), in one call to the embedder.

    A contextual embedder (MiniLM) reads each text once: its vector is its first pass's (the text
    cut at the model's 256 pieces) and each window's the mean of its pieces' states in a pass.
    Otherwise a text with windows is embedded only as its windows: its own vector is its first
    window's (the text cut at `window` pieces). A separate pass would read its first 256 pieces a
    third time for a vector that only the neighbour graph and IVF use; a passage scores the max
    over its vector and its windows either way."""
    if window and contextual(embedder):
        vectors, windows, owners = embedder.embed_with_windows(texts, window, stride)  # pyright: ignore[reportAttributeAccessIssue]
        return vectors, windows, owners + offset
    pieces, owner = window_pieces(embedder, texts, window, stride)
    has_windows = np.zeros(len(texts), dtype=bool)
    has_windows[np.asarray(owner, dtype=np.int64)] = True
    short = np.flatnonzero(~has_windows)
    out = np.asarray(embedder.embed([texts[i] for i in short.tolist()] + pieces), dtype=np.float32) if len(short) or pieces \
        else np.zeros((0, embedder.dim), dtype=np.float32)
    vectors = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    vectors[short] = out[: len(short)]
    windows, owners = out[len(short) :], np.asarray(owner, dtype=np.int64)
    return pool_windows(vectors, windows, owners), windows, owners + offset


def embed_in_batches(embedder: Embedder, texts: Sequence[str], window: int, stride: int, *, batch: int,
                     offset: int = 0, progress: Callable[[int, int], None] | None = None,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`embed_passages` over `texts`, `batch` texts at a time (each with its windows), calling
    progress(done, total) over texts before the first batch and after each one."""
    texts = list(texts)
    if progress is not None:
        progress(0, len(texts))
    parts = [embed_passages(embedder, [], window, stride)]  # the shapes of an empty result
    for start in range(0, len(texts), batch):
        part = texts[start : start + batch]
        parts.append(embed_passages(embedder, part, window, stride, offset + start))
        if progress is not None:
            progress(start + len(part), len(texts))
    vectors, windows, owner = (np.concatenate(x) for x in zip(*parts, strict=True))
    return vectors, windows, owner


def pool_windows(vectors: np.ndarray, windows: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """`vectors` with the row of every text that has windows set to its first window's vector."""
    out = np.array(vectors, dtype=np.float32)
    if len(owner):
        starts = np.flatnonzero(np.r_[True, np.diff(owner) > 0])
        out[owner[starts]] = np.asarray(windows, dtype=np.float32)[starts]
    return out


def embed_windows(
    embedder: Embedder, texts: Sequence[str], window: int = WINDOW, stride: int = STRIDE
) -> tuple[np.ndarray, np.ndarray]:
    """Window vectors of every text longer than `window` pieces, and the text each belongs to
    (`owner`, ascending), under the embedder's scheme (embed_passages)."""
    if window and contextual(embedder):
        _, _, windows, owners = embed_long(embedder, texts, window, stride)
        return windows, owners
    pieces, owner = window_pieces(embedder, texts, window, stride)
    vectors = embedder.embed(pieces) if pieces else np.zeros((0, embedder.dim), dtype=np.float32)
    return np.asarray(vectors, dtype=np.float32), np.asarray(owner, dtype=np.int64)


def embed_long(embedder: Embedder, texts: Sequence[str], window: int, stride: int,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Of the texts with windows only: their rows, their own vectors, their window vectors and the
    row each belongs to, as embed_passages makes them (the other texts are not embedded)."""
    keep = [i for i, t in enumerate(texts) if has_windows(embedder, t, window)]
    vectors, windows, owner = embed_passages(embedder, [texts[i] for i in keep], window, stride)
    rows = np.asarray(keep, dtype=np.int64)
    return rows, vectors, windows, rows[owner]


class DenseRetriever:
    """Embeds passages once (`fit`) or takes stored vectors (`set_vectors`) and scores by cosine.

    `vectors` holds one whole-text vector per passage (the neighbour graph and IVF use these);
    `window_vectors` / `window_owner` the windows of long passages. A passage scores the max over
    its whole-text vector and its windows. `window=0` keeps one vector per passage.

    A stored index keeps vectors in slots, some of them dead (their passage removed, the slot kept
    until the store is compacted): `set_vectors(..., live=slots)` takes all slots (`stored`) and
    scores only the live ones, in slot order (positions 0..size-1); `vectors` are theirs.
    """

    name = "dense"

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        ann_threshold: int = ANN_THRESHOLD,
        window: int = WINDOW,
        stride: int = STRIDE,
        rocchio: Rocchio | None = None,
    ) -> None:
        if window < 0 or (window and not 0 < stride <= window):
            raise InvalidInput("window must be >= 0 and stride in 1..window")
        self._embedder = embedder
        self.ann_threshold = ann_threshold
        self.window, self.stride = window, stride
        self.rocchio = rocchio
        dim = embedder.dim if embedder else 384
        self.stored = np.zeros((0, dim), dtype=np.float32)  # per slot
        self.live: np.ndarray | None = None  # the slots of positions 0..size-1 (None: every slot)
        self._pos = np.zeros(0, dtype=np.int64)  # each slot's position, -1 for a dead one
        self.window_vectors = np.zeros((0, dim), dtype=np.float32)
        self.window_owner = np.zeros(0, dtype=np.int64)
        self._starts = np.zeros(0, dtype=np.int64)  # first row of each owner's run of windows
        self._ptr = np.zeros(1, dtype=np.int64)  # windows of passage i: rows _ptr[i]:_ptr[i+1]
        self.ivf: Candidates | None = None
        self.progress: Callable[[int, int], None] | None = None  # called while `fit` embeds
        # scores computed elsewhere (a PostgreSQL server with pgvector: tether.rag._pgvector): every
        # position's for a query vector, and the top k (None: take them from every position's)
        self.remote: Callable[[np.ndarray], np.ndarray] | None = None
        self.remote_top: Callable[[np.ndarray, int], list[tuple[int, float]] | None] | None = None

    @property
    def windows_key(self) -> str:
        """Identifies the window scheme (stored vectors are valid only for the same one): `pass`,
        windows pooled from one pass over each text (a contextual embedder); `first`, windows
        embedded as texts and a windowed passage's vector its first window's (embed_passages)."""
        if not self.window:
            return "none"
        return f"{self.window}:{self.stride}:{'pass' if contextual(self._embedder or MiniLMEncoder) else 'first'}"

    @property
    def vectors(self) -> np.ndarray:
        """The whole-text vector of each passage, by position."""
        return self.stored if self.live is None else self.stored[self.live]

    @property
    def size(self) -> int:
        """How many passages are scored."""
        return len(self.stored) if self.live is None else len(self.live)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = MiniLMEncoder()
        return self._embedder

    def fit(self, texts: Sequence[str]) -> None:
        """Embed `texts` and their windows (embed_passages); with `progress` set, in batches of
        256 texts, reporting progress(done, total) over texts."""
        texts = list(texts)
        batch = 256 if self.progress is not None else max(len(texts), 1)
        vectors, windows, owner = embed_in_batches(self.embedder, texts, self.window, self.stride, batch=batch,
                                                   progress=self.progress)
        self.set_vectors(vectors, windows=windows, owner=owner)

    def embed_windows(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Window vectors and owners for `texts` under this retriever's window scheme."""
        return embed_windows(self.embedder, texts, self.window, self.stride)

    def embed_long(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`embed_long` under this retriever's window scheme."""
        return embed_long(self.embedder, texts, self.window, self.stride)

    def set_vectors(
        self,
        vectors: np.ndarray,
        ivf: Candidates | None = None,
        *,
        windows: np.ndarray | None = None,
        owner: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> None:
        """Use precomputed (L2-normalised) vectors, and optionally window vectors with the passage
        each belongs to (`owner`, ascending). Builds an IVF index (on the whole-text vectors) above
        the threshold; a probed passage is then scored with its windows too. With `live` (ascending
        slots), `vectors` are per slot and only those slots are passages; `ivf` answers slots."""
        n = len(vectors)
        if windows is None:
            windows = np.zeros((0, vectors.shape[1]), dtype=np.float32)
            owner = np.zeros(0, dtype=np.int64)
        owner = np.asarray(owner, dtype=np.int64)
        if len(owner) != len(windows):
            raise InvalidInput(f"{len(windows)} window vectors but {len(owner)} owners")
        if len(owner) and (owner.min() < 0 or owner.max() >= n or np.any(np.diff(owner) < 0)):
            raise InvalidInput("window owners must be ascending passage rows")
        self.stored = vectors
        self.live = None if live is None else np.asarray(live, dtype=np.int64)
        self._pos = np.full(n, -1, dtype=np.int64)
        if self.live is not None:
            self._pos[self.live] = np.arange(len(self.live))
        self.window_vectors, self.window_owner = windows, owner
        self._ptr = np.searchsorted(owner, np.arange(n + 1)).astype(np.int64)
        self._starts = np.flatnonzero(np.diff(self._ptr)) if len(owner) else np.zeros(0, dtype=np.int64)
        if ivf is None and self.size > self.ann_threshold:
            ivf = IVFIndex.build(np.asarray(vectors))
        self.ivf = ivf

    def query_vector(self, query: str) -> np.ndarray:
        """The query's embedding, moved by Rocchio feedback when configured."""
        qv = self.embedder.embed([query])[0]
        return self.feedback_vector(qv) if self.rocchio is not None else qv

    def feedback_vector(self, qv: np.ndarray) -> np.ndarray:
        """Rocchio: the query vector plus beta times the mean of its top passages' vectors."""
        r = self.rocchio
        if r is None or not self.size:
            return qv
        top = np.asarray([i for i, _ in top_k(self.scores_for(qv), r.docs)], dtype=np.int64)
        slots = top if self.live is None else self.live[top]
        moved = qv + r.beta * np.asarray(self.stored[slots], dtype=np.float32).mean(axis=0)
        norm = float(np.linalg.norm(moved))
        return (moved / norm).astype(np.float32) if norm > 0 else qv

    def _window_max(self, qv: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(passage rows that have windows, their best window score), over all passages or `rows`."""
        if not len(self.window_owner):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        if rows is None:
            sims = np.asarray(self.window_vectors @ qv, dtype=np.float32)
            return self._starts, np.maximum.reduceat(sims, self._ptr[self._starts])
        rows = rows[self._ptr[rows + 1] > self._ptr[rows]]
        if not len(rows):
            return rows, np.zeros(0, dtype=np.float32)
        lens = self._ptr[rows + 1] - self._ptr[rows]
        offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
        idx = np.repeat(self._ptr[rows] - offsets, lens) + np.arange(int(lens.sum()))
        sims = np.asarray(self.window_vectors[idx] @ qv, dtype=np.float32)
        return rows, np.maximum.reduceat(sims, offsets)

    def _scored(self, qv: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """Scores of all passages (rows None), or of the IVF candidate positions `rows`."""
        if self.remote is not None:
            return None, self.remote(qv)
        if self.ivf is None:
            out = np.asarray(self.stored @ qv, dtype=np.float32)
            rows, best = self._window_max(qv)
            out[rows] = np.maximum(out[rows], best)
            return None, out if self.live is None else out[self.live]
        cand = np.asarray(self.ivf.candidates(qv), dtype=np.int64)  # slots
        if self.live is not None:
            cand = cand[self._pos[cand] >= 0]
        part = np.asarray(self.stored[cand] @ qv, dtype=np.float32)
        rows, best = self._window_max(qv, cand)
        if len(rows):
            where = np.full(len(self.stored), -1, dtype=np.int64)
            where[cand] = np.arange(len(cand))
            part[where[rows]] = np.maximum(part[where[rows]], best)
        return (cand if self.live is None else self._pos[cand]), part

    def scores_for(self, qv: np.ndarray) -> np.ndarray:
        rows, part = self._scored(qv)
        if rows is None:
            return part
        out = np.full(self.size, part.min() if len(part) else 0.0, dtype=np.float32)
        out[rows] = part
        return out

    def scores(self, query: str) -> np.ndarray:
        return self.scores_for(self.query_vector(query))

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        qv = self.query_vector(query)
        if self.remote_top is not None and (found := self.remote_top(qv, k)) is not None:
            return found
        rows, part = self._scored(qv)
        if rows is None:
            return top_k(part, k)
        return [(int(rows[i]), s) for i, s in top_k(part, k)]


def knn_graph(vectors: np.ndarray, k: int = 10, *, block: int = 256, ivf: Candidates | None = None) -> np.ndarray:
    """Each vector's `k` nearest other vectors by cosine, as an (n, k) array of row numbers."""
    n = len(vectors)
    if n and not vectors.shape[1]:  # (placeholders: a PostgreSQL server with pgvector holds them)
        raise OperationFailed("no neighbour graph from vectors of width 0: the vectors are on the server")
    k = min(k, max(n - 1, 0))
    out = np.zeros((n, k), dtype=np.int32)
    if k == 0:
        return out
    if ivf is not None:
        for i in range(n):
            rows = ivf.candidates(vectors[i])
            rows = rows[rows != i]
            sims = vectors[rows] @ vectors[i]
            best = rows[np.argsort(-sims)[:k]]
            out[i, : len(best)] = best
            out[i, len(best) :] = i  # too few candidates: point at itself
        return out
    for start in range(0, n, block):
        sims = np.asarray(vectors[start : start + block] @ vectors.T)
        rows = np.arange(start, min(start + block, n))
        sims[rows - start, rows] = -np.inf
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1)
        out[start : start + len(rows)] = np.take_along_axis(part, order, axis=1)
    return out
