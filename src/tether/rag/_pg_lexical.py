"""BM25 (with RM3) computed by PostgreSQL, for an index kept there (tether.rag._pg_index).

The writer stores each passage's stemmed terms as rows, in the same transaction as the passage:
`postings(term, id, tf)` and `doclen(id, len)`, deleted with their chunk (no foreign key: checking
one per posting made a first ingest several times slower).
A search sends the query's terms; the server sums BM25 over their postings (Lucene's variant, the
weights `BM25Retriever` computes: idf = ln(1 + (n - df + 0.5) / (df + 0.5)), tf / (tf + k1 (1 - b +
b len / avgdl))) and returns only the passages that match. RM3 takes the first pass's top passages'
terms from the server and asks again with the expanded query. The client tokenizes and stems the
query, as BM25Retriever does, and holds no postings, so nothing per generation is downloaded for the
lexical side. Scores agree with BM25Retriever's to float32 rounding (it computes in float32, the
server in float8): bench/rag_growth/pg_lexical.py measures the rank agreement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tether.rag._base import top_k
from tether.rag._chunking import Chunk
from tether.rag._lexical import BM25Retriever
from tether.rag._text import stem_many, word_tokens

SCHEMA = """
CREATE TABLE IF NOT EXISTS postings (term TEXT NOT NULL, id TEXT NOT NULL, tf INTEGER NOT NULL, PRIMARY KEY (term, id));
CREATE INDEX IF NOT EXISTS postings_id ON postings(id);
CREATE TABLE IF NOT EXISTS doclen (id TEXT PRIMARY KEY, len INTEGER NOT NULL)
"""

_SCORE = """
SELECT p.id, sum(q.w * q.idf * p.tf / (p.tf + %s * (1 - %s + %s * d.len / %s)))
FROM unnest(%s::text[], %s::float8[], %s::float8[]) AS q(term, w, idf)
JOIN postings p ON p.term = q.term JOIN doclen d ON d.id = p.id
GROUP BY p.id
"""


def delete_postings(conn: Any, ids: Sequence[str]) -> None:
    """Delete the terms of the chunks `ids` (inside the writer's transaction, with the chunks)."""
    if ids:
        conn.execute("DELETE FROM postings WHERE id = ANY(%s)", (list(ids),))
        conn.execute("DELETE FROM doclen WHERE id = ANY(%s)", (list(ids),))


def write_postings(conn: Any, chunks: Sequence[Chunk], stem: bool = True) -> None:
    """Store the terms of `chunks` (psycopg connection, inside the writer's transaction), by COPY."""
    texts = [c.indexed_text for c in chunks]
    corpus = stem_many(texts) if stem else [word_tokens(t) for t in texts]
    with conn.cursor() as cur:
        with cur.copy("COPY postings (term, id, tf) FROM STDIN") as copy:
            for c, toks in zip(chunks, corpus, strict=True):
                for term, tf in Counter(toks).items():
                    copy.write_row((term, c.id, tf))
        with cur.copy("COPY doclen (id, len) FROM STDIN") as copy:
            for c, toks in zip(chunks, corpus, strict=True):
                copy.write_row((c.id, len(toks)))


class ServerBM25:
    """The scores of `like` (a BM25Retriever's k1, b, stemming and RM3) for the passages `ids` (in
    row order), computed by the server; `like.remote` is set to this object's `scores`."""

    def __init__(self, conn: Any, like: BM25Retriever, ids: Sequence[str]) -> None:
        self.conn, self.like = conn, like
        self.row_of = {cid: row for row, cid in enumerate(ids)}
        self.ids = list(ids)
        n, avgdl = conn.execute("SELECT count(*), coalesce(avg(len), 0) FROM doclen").fetchone()
        self.n = int(n)
        self.avgdl = float(avgdl) if self.n and float(avgdl) else 1.0

    def _df(self, terms: Sequence[str]) -> dict[str, int]:
        if not terms:
            return {}
        return dict(self.conn.execute("SELECT term, count(*) FROM postings WHERE term = ANY(%s) GROUP BY term",
                                      (list(terms),)).fetchall())

    def _score(self, weights: dict[str, float], df: dict[str, int]) -> np.ndarray:
        out = np.zeros(len(self.ids), dtype=np.float32)
        if not weights or not self.n:
            return out
        terms = list(weights)
        idf = [float(np.log(1 + (self.n - df[t] + 0.5) / (df[t] + 0.5))) for t in terms]
        k1, b = self.like.k1, self.like.b
        rows = self.conn.execute(_SCORE, (k1, b, b, self.avgdl, terms, [weights[t] for t in terms], idf)).fetchall()
        for cid, score in rows:
            row = self.row_of.get(cid)
            if row is not None:  # a passage of a later generation than this search's rows: not ours
                out[row] = score
        return out

    def _feedback(self, weights: dict[str, float], first: np.ndarray) -> dict[str, float]:
        """RM3 as BM25Retriever.feedback_weights computes it, from the top passages' rows."""
        rm3 = self.like.rm3
        if rm3 is None or not weights:
            return weights
        top = [(d, s) for d, s in top_k(first, rm3.docs) if s > 0]
        if not top:
            return weights
        score_of = {self.ids[d]: s for d, s in top}
        fb: dict[str, float] = {}
        for cid, term, tf, length in self.conn.execute(
                "SELECT p.id, p.term, p.tf, d.len FROM postings p JOIN doclen d ON d.id = p.id WHERE p.id = ANY(%s)",
                (list(score_of),)).fetchall():
            fb[term] = fb.get(term, 0.0) + tf / max(length, 1) * score_of[cid]
        df = self._df(list(fb))
        common = rm3.max_df * max(self.n, 1)
        ranked = sorted(((w, t) for t, w in fb.items() if df.get(t, 0) <= common and w > 0), key=lambda x: (-x[0], x[1]))
        keep = ranked[: rm3.terms]
        total_fb = sum(w for w, _ in keep)
        total_q = sum(weights.values())
        out = {t: rm3.original * w / total_q for t, w in weights.items()}
        for w, t in keep:
            out[t] = out.get(t, 0.0) + (1 - rm3.original) * w / total_fb
        return out

    def scores(self, query: str) -> np.ndarray:
        counts = Counter(self.like._tokens(query))
        df = self._df(list(counts))
        weights = {t: float(c) for t, c in counts.items() if df.get(t)}
        first = self._score(weights, df)
        if self.like.rm3 is None:
            return first
        expanded = self._feedback(weights, first)
        return self._score(expanded, {**df, **self._df([t for t in expanded if t not in df])})
