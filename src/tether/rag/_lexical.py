"""Lexical retrievers: textbook TF-IDF cosine and BM25 with stemming (PyStemmer).

Both keep an inverted index as CSC-style arrays (per term: the passages it occurs in and a
weight) and score a query with one `np.bincount` over the query terms' postings, which keeps
lexical search well above 2,000 queries per second on small and medium stores.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

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


class BM25Retriever:
    """BM25 (Lucene variant, the weights bm25s computes) over Snowball-stemmed tokens; optional RM3
    feedback. `update` drops and adds passages without re-tokenizing the others.

    Query terms count as often as they occur, as in bm25s's own scoring.
    """

    name = "bm25"

    def __init__(self, k1: float = 1.5, b: float = 0.75, stem: bool = True, rm3: RM3 | None = None) -> None:
        self.k1, self.b, self.stem, self.rm3 = k1, b, stem, rm3
        self.vocab: dict[str, int] = {}
        self._post = _Postings(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), 0)
        # Forward index for RM3: passage d's terms are _fterms[_fptr[d]:_fptr[d+1]], with tf / length.
        self._fterms = np.zeros(0, dtype=np.int64)
        self._fprob = np.zeros(0, dtype=np.float64)
        self._fptr = np.zeros(1, dtype=np.int64)
        self._common = np.zeros(0, dtype=bool)
        self._term_rank = np.zeros(0, dtype=np.int64)
        # Term counts per posting and passage lengths, so `update` can recompute weights without the texts
        self._tf = np.zeros(0, dtype=np.float32)
        self._doclen = np.zeros(0, dtype=np.float32)
        # Scores computed elsewhere from the same settings (a PostgreSQL index's server: _pg_lexical)
        self.remote: Callable[[str], np.ndarray] | None = None

    def _tokens(self, text: str) -> list[str]:
        return stemmed_tokens(text) if self.stem else word_tokens(text)

    def fit(self, texts: Sequence[str]) -> None:
        self.vocab = {}
        self._tf = np.zeros(0, dtype=np.float32)
        self._doclen = np.zeros(0, dtype=np.float32)
        self._post = _Postings(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), 0)
        self.update([], texts)

    def update(self, dropped: Sequence[int], texts: Sequence[str]) -> None:
        """Drop passages `dropped` (later ones move down) and append `texts`, as `fit` on the
        resulting store would: only `texts` are tokenized, the weights of every posting are
        recomputed from the stored term counts (idf and the mean length change with any passage)."""
        post = self._post
        # 32-bit ids and counts: a store's postings take half the memory (2**31 passages is far off)
        terms = np.repeat(np.arange(len(post.indptr) - 1, dtype=np.int32), np.diff(post.indptr))
        docs, tf, doclen = post.indices.astype(np.int32, copy=False), self._tf, self._doclen
        if len(dropped):
            gone = np.asarray(dropped, dtype=np.int32)
            keep = ~np.isin(docs, gone)
            terms, docs, tf = terms[keep], docs[keep], tf[keep]
            docs = (docs - np.searchsorted(gone, docs)).astype(np.int32)
            doclen = np.delete(doclen, gone)
        corpus = stem_many(texts) if self.stem else [word_tokens(t) for t in texts]
        n_old = len(doclen)
        # typed arrays, not lists of ints: a million postings in 12 MB rather than 100
        new_terms, new_docs, new_tf = array("i"), array("i"), array("i")
        for d, toks in enumerate(corpus, start=n_old):
            for term, c in Counter(toks).items():
                new_terms.append(self.vocab.setdefault(term, len(self.vocab)))
                new_docs.append(d)
                new_tf.append(c)
        nt, nd = np.frombuffer(new_terms, dtype=np.int32), np.frombuffer(new_docs, dtype=np.int32)
        first = np.lexsort((nd, nt))
        # The kept postings are in (term, passage) order and the new passages come after all of
        # them: a stable sort by term merges the two sorted runs (timsort: linear, not n log n).
        terms, docs = np.concatenate([terms, nt[first]]), np.concatenate([docs, nd[first]])
        tf = np.concatenate([tf, np.frombuffer(new_tf, dtype=np.int32)[first].astype(np.float32)])
        order = np.argsort(terms, kind="stable")
        doclen = np.concatenate([doclen, np.asarray([len(t) for t in corpus], dtype=np.float32)])
        forward = self._carry_forward(dropped, nt, nd, np.frombuffer(new_tf, dtype=np.int32), doclen, n_old)
        self._rebuild(terms[order], docs[order], tf[order], doclen, forward)

    def _carry_forward(self, dropped: Sequence[int], nt: np.ndarray, nd: np.ndarray, ntf: np.ndarray,
                       doclen: np.ndarray, n_old: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """RM3's forward index after an update, from the last one (None without RM3): the dropped
        passages' entries cut out, the new passages' appended (each passage's terms in term order,
        as a full rebuild sorts them). A passage's tf / length does not change with the others, so
        nothing is re-sorted: linear in the store, not n log n."""
        if self.rm3 is None:
            return None
        counts = np.diff(self._fptr)
        keep = np.ones(len(self._fterms), dtype=bool)
        if len(dropped):
            gone = np.asarray(dropped, dtype=np.int64)
            keep[_ranges(self._fptr[gone], counts[gone])] = False
            counts = np.delete(counts, gone)
        by_doc = np.lexsort((nt, nd))  # only the new postings
        new_docs = nd[by_doc]
        fterms = np.concatenate([self._fterms[keep], nt[by_doc].astype(np.int64)])
        fprob = np.concatenate([self._fprob[keep],
                                ntf[by_doc].astype(np.float64) / np.maximum(doclen[new_docs], 1)])
        counts = np.concatenate([counts, np.bincount(new_docs - n_old, minlength=len(doclen) - n_old)])
        fptr = np.zeros(len(doclen) + 1, dtype=np.int64)
        np.cumsum(counts, out=fptr[1:])
        return fterms, fprob, fptr

    def _rebuild(self, terms: np.ndarray, docs: np.ndarray, tf: np.ndarray, doclen: np.ndarray,
                 forward: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """Postings (BM25, Lucene variant, as bm25s computes it) from (term, passage, count) triples
        in (term, passage) order; RM3's forward index taken as `forward` when given."""
        n, n_terms = len(doclen), len(self.vocab)
        df = np.bincount(terms, minlength=n_terms)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        idf = np.log(1 + (n - df + 0.5) / (df + 0.5)).astype(np.float32)
        avgdl = float(doclen.mean()) if n and doclen.sum() else 1.0
        norm = (self.k1 * (1 - self.b + self.b * doclen / avgdl)).astype(np.float32)
        data = idf[terms] * tf / (tf + norm[docs])
        self._post = _Postings(data, docs, indptr, n)
        self._tf, self._doclen = tf.astype(np.float32), doclen.astype(np.float32)
        # Terms are numbered as first met; ties between feedback terms are broken by the term itself
        self._term_rank = np.zeros(n_terms, dtype=np.int64)
        for rank, term in enumerate(sorted(self.vocab)):
            self._term_rank[self.vocab[term]] = rank
        if self.rm3 is not None and forward is not None:
            self._fterms, self._fprob, self._fptr = forward
            self._common = df > self.rm3.max_df * max(n, 1)
        elif self.rm3 is not None:  # forward index: each passage's terms with tf / length
            by_doc = np.lexsort((terms, docs))
            self._fterms = terms[by_doc]
            self._fprob = tf[by_doc].astype(np.float64) / np.maximum(doclen[docs[by_doc]], 1)
            self._fptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(docs, minlength=n), out=self._fptr[1:])
            self._common = df > self.rm3.max_df * max(n, 1)
        else:
            self._fptr = np.zeros(n + 1, dtype=np.int64)

    def key(self) -> str:
        """What the fitted state depends on besides the texts (stored states are reused only for it)."""
        return f"bm25:{self.k1}:{self.b}:{self.stem}:{self.rm3}:counts"

    def arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as arrays (`restore` takes them back): a stored index reopens without refitting."""
        return {**_vocab_arrays(self.vocab), **self._post.arrays(), "fterms": self._fterms, "fprob": self._fprob,
                "fptr": self._fptr, "common": self._common, "term_rank": self._term_rank, "tf": self._tf,
                "doclen": self._doclen}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        self.vocab = _vocab_from(arrays)
        self._post = _Postings.from_arrays(arrays)
        self._fterms, self._fprob, self._fptr = arrays["fterms"], arrays["fprob"], arrays["fptr"]
        self._common, self._term_rank = arrays["common"], arrays["term_rank"]
        self._tf, self._doclen = arrays["tf"], arrays["doclen"]

    def term_weights(self, query: str) -> dict[int, float]:
        counts = Counter(t for t in self._tokens(query) if t in self.vocab)
        return {self.vocab[t]: float(c) for t, c in counts.items()}

    def feedback_weights(self, weights: dict[int, float], first: np.ndarray) -> dict[int, float]:
        """RM3's expanded query from the original term weights and the first-pass scores."""
        rm3 = self.rm3
        if rm3 is None or not weights or not len(self._fterms):
            return weights
        top = [(d, s) for d, s in top_k(first, rm3.docs) if s > 0]
        if not top:
            return weights
        idx = np.concatenate([np.arange(self._fptr[d], self._fptr[d + 1]) for d, _ in top])
        doc_w = np.concatenate([np.full(self._fptr[d + 1] - self._fptr[d], s) for d, s in top])
        fb = np.bincount(self._fterms[idx], self._fprob[idx] * doc_w, minlength=len(self._common))
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
        if self.remote is not None:
            return self.remote(query)
        weights = self.term_weights(query)
        first = self._post.score(weights)
        if self.rm3 is None:
            return first
        return self._post.score(self.feedback_weights(weights, first))

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        """The `k` best passages that share a term with the query (never padded with score-0 ones)."""
        return [(d, s) for d, s in top_k(self.scores(query), k) if s > 0]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions starts[i] .. starts[i] + lengths[i] - 1 of every i, concatenated."""
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, dtype=np.int64)
    return np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))


def _vocab_arrays(vocab: dict[str, int]) -> dict[str, np.ndarray]:
    terms = list(vocab)
    return {"vocab_terms": np.asarray(terms, dtype=str) if terms else np.zeros(0, dtype="<U1"),
            "vocab_ids": np.asarray([vocab[t] for t in terms], dtype=np.int64)}


def _vocab_from(arrays: dict[str, np.ndarray]) -> dict[str, int]:
    return dict(zip(arrays["vocab_terms"].tolist(), arrays["vocab_ids"].tolist(), strict=True))
