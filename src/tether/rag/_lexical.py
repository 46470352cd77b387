"""Lexical retrievers: textbook TF-IDF cosine and BM25 with stemming (PyStemmer).

Both keep an inverted index as CSC-style arrays (per term: the passages it occurs in) and score a
query with one `np.bincount` over the query terms' postings, which keeps lexical search well above
2,000 queries per second on small and medium stores. TF-IDF stores the weights; BM25 stores term
counts in segments and weighs them at query time, so a change costs its own passages.
"""

from __future__ import annotations

import itertools
import math
import os
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tether._errors import InvalidInput
from tether.rag._base import top_k
from tether.rag._text import simple_tokens, stem_many, stemmed_tokens, word_tokens


class _Postings:
    """Per-term postings: passages `indices[indptr[t]:indptr[t+1]]` with `data` weights."""

    def __init__(self, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n_docs: int) -> None:
        self.data = data
        self.indices = indices
        self.indptr = indptr
        self.n_docs = n_docs

    def arrays(self) -> dict[str, np.ndarray]:
        return {"post_data": self.data, "post_indices": self.indices, "post_indptr": self.indptr,
                "post_n_docs": np.asarray(self.n_docs)}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> _Postings:
        return cls(a["post_data"], a["post_indices"], a["post_indptr"], int(a["post_n_docs"]))

    def score(self, term_weights: dict[int, float]) -> np.ndarray:
        if not term_weights or self.n_docs == 0:
            return np.zeros(self.n_docs, dtype=np.float32)
        idx_parts, w_parts = [], []
        for t, w in term_weights.items():
            a, b = self.indptr[t], self.indptr[t + 1]
            idx_parts.append(self.indices[a:b])
            w_parts.append(self.data[a:b] * w)
        out = np.bincount(np.concatenate(idx_parts), np.concatenate(w_parts), minlength=self.n_docs)
        return out.astype(np.float32, copy=False)


class TfidfRetriever:
    """Textbook TF-IDF cosine: lowercase `[a-z0-9]+` tokens minus a small stop list, raw term
    counts, idf = log((1+N)/(1+df)) + 1, both vectors L2-normalised, score = cosine."""

    name = "tfidf"

    def __init__(self, tokenize: Callable[[str], list[str]] = simple_tokens) -> None:
        self.tokenize = tokenize
        self.vocab: dict[str, int] = {}
        self.idf = np.zeros(0, dtype=np.float64)
        self._post = _Postings(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), 0)

    def fit(self, texts: Sequence[str]) -> None:
        vocab: dict[str, int] = {}
        rows: list[tuple[int, int, int]] = []  # (term, doc, count)
        for d, text in enumerate(texts):
            for term, c in Counter(self.tokenize(text)).items():
                rows.append((vocab.setdefault(term, len(vocab)), d, c))
        n = len(texts)
        arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
        df = np.bincount(arr[:, 0], minlength=len(vocab))
        idf = np.log((1 + n) / (1 + df)) + 1.0
        w = arr[:, 2] * idf[arr[:, 0]]
        norms = np.sqrt(np.bincount(arr[:, 1], w * w, minlength=n))
        w = w / np.where(norms > 0, norms, 1.0)[arr[:, 1]]
        order = np.lexsort((arr[:, 1], arr[:, 0]))
        indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        self.vocab, self.idf = vocab, idf
        self._post = _Postings(w[order], arr[order, 1], indptr, n)

    def key(self) -> str:
        """What the fitted state depends on besides the texts (stored states are reused only for it)."""
        return f"tfidf:{getattr(self.tokenize, '__qualname__', repr(self.tokenize))}"

    def arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as arrays (`restore` takes them back): a stored index reopens without refitting."""
        return {**_vocab_arrays(self.vocab), "idf": self.idf, **self._post.arrays()}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        self.vocab = _vocab_from(arrays)
        self.idf = arrays["idf"]
        self._post = _Postings.from_arrays(arrays)

    def _query_weights(self, query: str) -> dict[int, float]:
        counts = Counter(t for t in self.tokenize(query) if t in self.vocab)
        weights = {self.vocab[t]: c * self.idf[self.vocab[t]] for t, c in counts.items()}
        norm = math.sqrt(sum(v * v for v in weights.values()))
        return {t: v / norm for t, v in weights.items()} if norm else {}

    def scores(self, query: str) -> np.ndarray:
        return self._post.score(self._query_weights(query))

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        """The `k` best passages that share a term with the query (never padded with score-0 ones)."""
        return [(d, s) for d, s in top_k(self.scores(query), k) if s > 0]


@dataclass(frozen=True, slots=True)
class RM3:
    """RM3 pseudo-relevance feedback: the query is re-weighted with the terms of the `docs` best
    first-pass passages. Each passage's term distribution (tf / length) is weighted by its
    first-pass score; the `terms` heaviest terms, L1-normalised, are mixed with the L1-normalised
    original query as `original * query + (1 - original) * feedback`. Terms found in more than
    `max_df` of the passages are skipped (the stop list is small on purpose)."""

    docs: int = 10
    terms: int = 20
    original: float = 0.5
    max_df: float = 0.1


class _Segment:
    """The postings of the passages in slots [start, end), written once (by the change that added
    them, or by a merge of neighbouring segments): by term (`indptr` over the vocabulary as it was,
    `slots`, `tf`) and by passage (`fptr` over the slots, `fterms`, `ftf`), their lengths, and the
    terms they added to the vocabulary (ids `vocab_start` on)."""

    ARRAYS = ("indptr", "slots", "tf", "fptr", "fterms", "ftf", "doclen", "terms")

    def __init__(self, name: str, start: int, vocab_start: int, a: dict[str, np.ndarray]) -> None:
        self.name, self.start, self.vocab_start = name, start, vocab_start
        self.indptr, self.slots, self.tf = a["indptr"], a["slots"], a["tf"]
        self.fptr, self.fterms, self.ftf = a["fptr"], a["fterms"], a["ftf"]
        self.doclen, self.terms = a["doclen"], a["terms"]

    @property
    def end(self) -> int:
        return self.start + len(self.doclen)

    @property
    def size(self) -> int:
        return len(self.slots)

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in self.ARRAYS}


def _segment_name() -> str:
    return os.urandom(6).hex()


class BM25Retriever:
    """BM25 (Lucene variant, the weights bm25s computes) over Snowball-stemmed tokens; optional RM3
    feedback. `update` drops and adds passages at the cost of the change.

    Passages live in slots: `fit` puts them in slots 0..n-1 (or the `slots` given), `update` marks
    slots dropped and appends new ones; scores are per live slot, ascending (the positions). Only
    term counts are stored, in segments of postings written once; the weights are computed at query
    time from them, the live document frequencies and the mean length, so a change touches only its
    own passages (and merges small segments now and then, each posting log-many times in all).

    Query terms count as often as they occur, as in bm25s's own scoring.
    """

    name = "bm25"

    def __init__(self, k1: float = 1.5, b: float = 0.75, stem: bool = True, rm3: RM3 | None = None) -> None:
        self.k1, self.b, self.stem, self.rm3 = k1, b, stem, rm3
        self.vocab: dict[str, int] = {}
        self.segments: list[_Segment] = []
        self.df = np.zeros(0, dtype=np.int64)  # live passages per term
        self.live = np.zeros(0, dtype=bool)  # per slot
        self.positions = np.zeros(0, dtype=np.int64)  # the live slots, ascending
        self._derive()
        # Scores computed elsewhere from the same settings (a PostgreSQL index's server: _pg_lexical)
        self.remote: Callable[[str], np.ndarray] | None = None

    def _tokens(self, text: str) -> list[str]:
        return stemmed_tokens(text) if self.stem else word_tokens(text)

    @property
    def slots(self) -> int:
        """How many slots there are, live or not (the next new passage takes this one)."""
        return len(self.live)

    def fit(self, texts: Sequence[str], slots: Sequence[int] | np.ndarray | None = None) -> None:
        """Index `texts` in slots 0..n-1, or in the ascending `slots` given (the others dead)."""
        self.vocab, self.segments = {}, []
        self.df, self.live = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
        self.update([], texts, slots)

    def update(self, dropped: Sequence[int] | np.ndarray, texts: Sequence[str],
               slots: Sequence[int] | np.ndarray | None = None) -> None:
        """Mark the slots `dropped` dead and put `texts` in new slots (`slots`, ascending from
        `self.slots` on; default the next ones), as `fit` on the resulting store would score them:
        only `texts` are tokenized and only the dropped passages' postings are read."""
        gone = np.asarray(dropped, dtype=np.int64)
        if len(gone):
            gone = gone[self.live[gone]]
            for d in gone.tolist():
                seg = self._segment_of(d)
                i = d - seg.start
                np.subtract.at(self.df, np.asarray(seg.fterms[seg.fptr[i] : seg.fptr[i + 1]], dtype=np.int64), 1)
            self.live[gone] = False
        if len(texts):
            at = np.arange(self.slots, self.slots + len(texts)) if slots is None else np.asarray(slots, dtype=np.int64)
            if len(at) != len(texts) or at[0] < self.slots or np.any(np.diff(at) <= 0):
                raise InvalidInput("new passages need ascending slots after the existing ones")
            self.segments.append(self._new_segment(texts, at))
            self._merge_tail()
        self._derive()

    def _new_segment(self, texts: Sequence[str], at: np.ndarray) -> _Segment:
        corpus = stem_many(texts) if self.stem else [word_tokens(t) for t in texts]
        vocab_start = len(self.vocab)
        # typed arrays, not lists of ints: a million postings in 12 MB rather than 100
        terms, docs, tfs = array("i"), array("i"), array("i")
        for d, toks in zip(at.tolist(), corpus, strict=True):
            for term, c in sorted((self.vocab.setdefault(term, len(self.vocab)), c) for term, c in Counter(toks).items()):
                terms.append(term)
                docs.append(d)
                tfs.append(c)
        start, end = self.slots, int(at[-1]) + 1
        nt, nd = np.frombuffer(terms, dtype=np.int32), np.frombuffer(docs, dtype=np.int32)
        tf = np.frombuffer(tfs, dtype=np.int32).astype(np.float32)
        doclen = np.zeros(end - start, dtype=np.float32)
        doclen[at - start] = [len(t) for t in corpus]
        counts = np.bincount(nd - start, minlength=end - start)
        fptr = np.zeros(end - start + 1, dtype=np.int64)
        np.cumsum(counts, out=fptr[1:])
        order = np.argsort(nt, kind="stable")  # by term, then slot (the postings are in slot order)
        n_terms = len(self.vocab)
        df = np.bincount(nt, minlength=n_terms)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        self.df = np.concatenate([self.df, np.zeros(n_terms - len(self.df), dtype=np.int64)]) + df
        live = np.zeros(end, dtype=bool)
        live[: self.slots] = self.live
        live[at] = True
        self.live = live
        new_terms = list(itertools.islice(self.vocab, vocab_start, None))  # (a dict keeps the order of ids)
        return _Segment(_segment_name(), start, vocab_start, {
            "indptr": indptr, "slots": nd[order], "tf": tf[order], "fptr": fptr, "fterms": nt, "ftf": tf,
            "doclen": doclen, "terms": _str_array(new_terms)})

    def _merge_tail(self) -> None:
        """Merge the newest segments while the newest is at least half the size of the one before
        (segment sizes fall geometrically: few segments, each posting merged log-many times)."""
        while len(self.segments) >= 2 and 2 * self.segments[-1].size >= self.segments[-2].size:
            b = self.segments.pop()
            a = self.segments.pop()
            self.segments.append(self._merged([a, b]))

    def _merged(self, segs: Sequence[_Segment]) -> _Segment:
        """One segment with the postings of neighbouring `segs`, dead passages' left out."""
        n_terms = len(segs[-1].indptr) - 1
        start, end = segs[0].start, segs[-1].end
        live = self.live[start:end]
        term_parts, slot_parts, tf_parts = [], [], []
        for seg in segs:  # each segment's postings by term then slot, segments in slot order
            t = np.repeat(np.arange(len(seg.indptr) - 1, dtype=np.int32), np.diff(seg.indptr))
            sl = np.asarray(seg.slots)
            keep = live[sl - start]
            term_parts.append(t[keep])
            slot_parts.append(sl[keep])
            tf_parts.append(np.asarray(seg.tf)[keep])
        terms, slots, tf = (np.concatenate(x) for x in (term_parts, slot_parts, tf_parts))
        order = np.argsort(terms, kind="stable")
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(np.bincount(terms, minlength=n_terms), out=indptr[1:])
        counts = np.concatenate([np.diff(np.asarray(seg.fptr)) for seg in segs])
        fterms = np.concatenate([np.asarray(seg.fterms) for seg in segs])
        ftf = np.concatenate([np.asarray(seg.ftf) for seg in segs])
        keep = np.repeat(live, counts)
        counts = np.where(live, counts, 0)
        fptr = np.zeros(end - start + 1, dtype=np.int64)
        np.cumsum(counts, out=fptr[1:])
        return _Segment(_segment_name(), start, segs[0].vocab_start, {
            "indptr": indptr, "slots": slots[order].astype(np.int32), "tf": tf[order].astype(np.float32),
            "fptr": fptr, "fterms": fterms[keep].astype(np.int32), "ftf": ftf[keep].astype(np.float32),
            "doclen": np.concatenate([np.asarray(seg.doclen) for seg in segs]),
            "terms": _str_array([t for seg in segs for t in np.asarray(seg.terms).tolist()])})

    def compacted(self) -> BM25Retriever:
        """The same passages in slots 0..n-1 (in order), in one segment; the vocabulary is kept."""
        out = BM25Retriever(self.k1, self.b, self.stem, self.rm3)
        out.vocab = dict(self.vocab)
        if not self.segments:
            out.live = np.ones(len(self.positions), dtype=bool)
            out.df = self.df.copy()
            out._derive()
            return out
        merged = self._merged(self.segments)  # (segments start at slot 0 and follow each other)
        new_slot = np.full(self.slots, -1, dtype=np.int64)
        new_slot[self.positions] = np.arange(len(self.positions))
        live = self.live[merged.start : merged.end]
        out.segments = [_Segment(_segment_name(), 0, 0, {
            "indptr": merged.indptr, "slots": new_slot[np.asarray(merged.slots)].astype(np.int32),
            "tf": merged.tf, "fptr": np.concatenate([[0], np.asarray(merged.fptr[1:])[live]]),
            "fterms": merged.fterms, "ftf": merged.ftf, "doclen": np.asarray(merged.doclen)[live],
            "terms": _str_array(list(self.vocab))})]
        out.df, out.live = self.df.copy(), np.ones(len(self.positions), dtype=bool)
        out._derive()
        return out

    def _segment_of(self, slot: int) -> _Segment:
        i = int(np.searchsorted(self._starts, slot, side="right")) - 1
        seg = self.segments[i]
        if not seg.start <= slot < seg.end:
            raise InvalidInput(f"no passage in slot {slot}")
        return seg

    def _derive(self) -> None:
        """What the weights need, from the live passages: idf per term, length norm per slot."""
        self.positions = np.flatnonzero(self.live)
        self._starts = np.asarray([seg.start for seg in self.segments], dtype=np.int64)
        self.doclen = (np.concatenate([np.asarray(seg.doclen) for seg in self.segments]) if self.segments
                       else np.zeros(0, dtype=np.float32))
        n = len(self.positions)
        dl = self.doclen[self.positions] if len(self.doclen) else self.doclen
        self.idf = np.log(1 + (n - self.df + 0.5) / (self.df + 0.5)).astype(np.float32)
        avgdl = float(dl.mean()) if n and dl.sum() else 1.0
        self.norm = (self.k1 * (1 - self.b + self.b * self.doclen / avgdl)).astype(np.float32)
        self._common = self.df > self.rm3.max_df * max(n, 1) if self.rm3 is not None else np.zeros(0, dtype=bool)
        self._rank: np.ndarray | None = None

    @property
    def _term_rank(self) -> np.ndarray:
        """Each term's place in the sorted vocabulary (RM3 breaks ties between terms by it)."""
        if self._rank is None or len(self._rank) != len(self.vocab):
            self._rank = np.zeros(len(self.vocab), dtype=np.int64)
            for rank, term in enumerate(sorted(self.vocab)):
                self._rank[self.vocab[term]] = rank
        return self._rank

    def key(self) -> str:
        """What the fitted state depends on besides the texts (stored states are reused only for it)."""
        return f"bm25:{self.k1}:{self.b}:{self.stem}:{self.rm3}:segments"

    def state(self) -> dict[str, np.ndarray]:
        """What a stored index keeps besides its segments (`restore` takes both back)."""
        return {"df": self.df, "live": self.live,
                "segments": _str_array([seg.name for seg in self.segments]),
                "starts": np.asarray([seg.start for seg in self.segments], dtype=np.int64),
                "vocab_starts": np.asarray([seg.vocab_start for seg in self.segments], dtype=np.int64)}

    def restore(self, state: dict[str, np.ndarray], segments: Callable[[str], dict[str, np.ndarray]]) -> None:
        """Take back a stored state; `segments(name)` gives a segment's arrays (memory-mapped)."""
        self.df = np.asarray(state["df"], dtype=np.int64)
        self.live = np.asarray(state["live"], dtype=bool)
        self.segments = [_Segment(name, int(start), int(vs), segments(name)) for name, start, vs in
                         zip(state["segments"].tolist(), state["starts"].tolist(), state["vocab_starts"].tolist(),
                             strict=True)]
        self.vocab = {t: i for seg in self.segments
                      for i, t in enumerate(np.asarray(seg.terms).tolist(), start=seg.vocab_start)}
        self._derive()

    def term_weights(self, query: str) -> dict[int, float]:
        counts = Counter(t for t in self._tokens(query) if t in self.vocab)
        return {self.vocab[t]: float(c) for t, c in counts.items()}

    def _slot_scores(self, weights: dict[int, float]) -> np.ndarray:
        """The score of every slot (dead ones too: the caller takes the live ones)."""
        n = self.slots
        if not weights or not len(self.positions):
            return np.zeros(n, dtype=np.float32)
        idx_parts, w_parts = [], []
        for t, w in weights.items():
            for seg in self.segments:
                if t + 1 >= len(seg.indptr):
                    continue
                a, b = seg.indptr[t], seg.indptr[t + 1]
                if a == b:
                    continue
                docs, tf = seg.slots[a:b], seg.tf[a:b]
                idx_parts.append(docs)
                w_parts.append(self.idf[t] * tf / (tf + self.norm[docs]) * w)
        if not idx_parts:
            return np.zeros(n, dtype=np.float32)
        out = np.bincount(np.concatenate(idx_parts), np.concatenate(w_parts), minlength=n)
        return out.astype(np.float32, copy=False)

    def feedback_weights(self, weights: dict[int, float], first: np.ndarray) -> dict[int, float]:
        """RM3's expanded query from the original term weights and the first-pass scores (per position)."""
        rm3 = self.rm3
        if rm3 is None or not weights or not len(self.positions):
            return weights
        top = [(d, s) for d, s in top_k(first, rm3.docs) if s > 0]
        if not top:
            return weights
        term_parts, w_parts = [], []
        for d, s in top:
            slot = int(self.positions[d])
            seg = self._segment_of(slot)
            i = slot - seg.start
            a, b = seg.fptr[i], seg.fptr[i + 1]
            term_parts.append(np.asarray(seg.fterms[a:b], dtype=np.int64))
            prob = np.asarray(seg.ftf[a:b], dtype=np.float64) / np.maximum(self.doclen[slot], 1)
            w_parts.append(prob * np.full(b - a, s))
        fb = np.bincount(np.concatenate(term_parts), np.concatenate(w_parts), minlength=len(self._common))
        fb[self._common] = 0.0
        keep = np.lexsort((self._term_rank[: len(fb)], -fb))[: rm3.terms]
        keep = keep[fb[keep] > 0]
        total_fb = float(fb[keep].sum())
        total_q = sum(weights.values())
        out = {t: rm3.original * w / total_q for t, w in weights.items()}
        for t in keep:
            out[int(t)] = out.get(int(t), 0.0) + (1 - rm3.original) * float(fb[t]) / total_fb
        return out

    def scores(self, query: str) -> np.ndarray:
        """One score per live passage, in slot order."""
        if self.remote is not None:
            return self.remote(query)
        weights = self.term_weights(query)
        first = self._slot_scores(weights)[self.positions]
        if self.rm3 is None:
            return first
        return self._slot_scores(self.feedback_weights(weights, first))[self.positions]

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        """The `k` best passages that share a term with the query (never padded with score-0 ones)."""
        return [(d, s) for d, s in top_k(self.scores(query), k) if s > 0]


def _str_array(items: list[str]) -> np.ndarray:
    return np.asarray(items, dtype=str) if items else np.zeros(0, dtype="<U1")


def _vocab_arrays(vocab: dict[str, int]) -> dict[str, np.ndarray]:
    terms = list(vocab)
    return {"vocab_terms": np.asarray(terms, dtype=str) if terms else np.zeros(0, dtype="<U1"),
            "vocab_ids": np.asarray([vocab[t] for t in terms], dtype=np.int64)}


def _vocab_from(arrays: dict[str, np.ndarray]) -> dict[str, int]:
    return dict(zip(arrays["vocab_terms"].tolist(), arrays["vocab_ids"].tolist(), strict=True))
