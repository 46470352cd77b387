"""BM25 (with RM3) computed by PostgreSQL, for an index kept there (tether.rag._pg_index).

The writer stores each passage's stemmed terms as rows, in the same transaction as the passage:
`postings(term, id, tf, len)` (the passage's length beside each term: no join per posting),
`docterms(id, len, terms, tfs)` (a passage's terms in one row: RM3's feedback and deletes read it)
and each term's document frequency `termdf(term, df)`, deleted (and decremented) with their chunk
(no foreign key: checking one per posting made a first ingest several times slower).
A search is one statement: the query's terms go to the server, which sums BM25 over their postings
(Lucene's variant, the weights `BM25Retriever` computes: idf = ln(1 + (n - df + 0.5) / (df + 0.5)),
tf / (tf + k1 (1 - b + b len / avgdl))), runs RM3 (the first pass's top passages' terms, weighted,
filtered by document frequency, mixed into the query) and the second pass, and returns the
passages that match with the index's current generation (a search of an older generation is asked
again once the client has the new one). The client tokenizes and stems the query, as
BM25Retriever does, and holds no postings, so nothing per generation is downloaded for the lexical
side. Scores agree with BM25Retriever's to float32 rounding (it computes in float32, the server in
float8): bench/rag_growth/pg_lexical.py measures the rank agreement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tether.rag._chunking import Chunk
from tether.rag._lexical import BM25Retriever
from tether.rag._text import stem_many, word_tokens

SCHEMA = """
DROP TABLE IF EXISTS doclen;
CREATE TABLE IF NOT EXISTS postings (term TEXT NOT NULL, id TEXT NOT NULL, tf INTEGER NOT NULL, len INTEGER NOT NULL,
    CONSTRAINT postings_pkey PRIMARY KEY (term, id));
ALTER TABLE postings ADD COLUMN IF NOT EXISTS len INTEGER NOT NULL DEFAULT 0;
DROP INDEX IF EXISTS postings_id;
CREATE TABLE IF NOT EXISTS docterms (id TEXT PRIMARY KEY, len INTEGER NOT NULL, terms TEXT[] NOT NULL, tfs INTEGER[] NOT NULL);
CREATE TABLE IF NOT EXISTS termdf (term TEXT PRIMARY KEY, df INTEGER NOT NULL)
"""
TABLES = ("postings", "docterms", "termdf")
BULK = 100_000  # postings from which a load into an empty table builds the key after it
VERSION = "3"  # meta `postings`: the layout above is kept for every passage (else written once, whole)

_BM25 = "p.tf / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.len / %(avgdl)s))"
_IDF = "ln(1 + (%(n)s - {df} + 0.5) / ({df} + 0.5))"
_FIRST = f"""
WITH q AS (SELECT * FROM unnest(%(terms)s::text[], %(counts)s::float8[]) AS q(term, w)),
qdf AS (SELECT q.term, q.w, t.df::float8 AS df FROM q JOIN termdf t ON t.term = q.term WHERE t.df > 0),
s1 AS (SELECT p.id, sum(qdf.w * {_IDF.format(df="qdf.df")} * {_BM25}) AS score
       FROM qdf JOIN postings p ON p.term = qdf.term GROUP BY p.id)"""
_GENERATION = "SELECT NULL::text, (SELECT value FROM meta WHERE key = 'generation')::float8"
SEARCH = f"{_FIRST}\n{_GENERATION} UNION ALL SELECT id, score FROM s1"
# RM3 as BM25Retriever.feedback_weights computes it: the first pass's top passages (float32 scores,
# ties by row), their terms' tf / len weighted by score, terms in more than max_df of the passages
# left out, the heaviest (ties by term) L1-normalised and mixed with the L1-normalised query.
SEARCH_RM3 = f"""{_FIRST},
top AS (SELECT s1.id, s1.score::float4::float8 AS score FROM s1 JOIN chunks c ON c.id = s1.id
        WHERE s1.score::float4 > 0 ORDER BY s1.score::float4 DESC, c.row LIMIT %(docs)s),
fb AS (SELECT u.term, sum(u.tf::float8 / greatest(d.len, 1) * top.score) AS w
       FROM top JOIN docterms d ON d.id = top.id CROSS JOIN LATERAL unnest(d.terms, d.tfs) AS u(term, tf) GROUP BY u.term),
keep AS (SELECT fb.term, fb.w, t.df::float8 AS df FROM fb JOIN termdf t ON t.term = fb.term
         WHERE t.df <= %(max_df)s * greatest(%(n)s, 1) AND fb.w > 0 ORDER BY fb.w DESC, fb.term COLLATE "C"
         LIMIT %(fterms)s),
e AS (SELECT term, sum(w) AS w, max(df) AS df FROM (
        SELECT term, %(original)s * w / (SELECT sum(w) FROM qdf) AS w, df FROM qdf
        UNION ALL SELECT term, (1 - %(original)s) * w / (SELECT sum(w) FROM keep), df FROM keep) x GROUP BY term),
s2 AS (SELECT p.id, sum(e.w * {_IDF.format(df="e.df")} * {_BM25}) AS score
       FROM e JOIN postings p ON p.term = e.term GROUP BY p.id)
{_GENERATION}
UNION ALL SELECT id, score FROM s2 WHERE EXISTS (SELECT 1 FROM top)
UNION ALL SELECT id, score FROM s1 WHERE NOT EXISTS (SELECT 1 FROM top)"""


class _Stale(Exception):
    """The index changed since the client read its rows: build the new generation and ask again."""


def delete_postings(conn: Any, ids: Sequence[str]) -> None:
    """Delete the terms of the chunks `ids` (inside the writer's transaction, with the chunks)."""
    if not ids:
        return
    gone = "SELECT id, unnest(terms) AS term FROM docterms WHERE id = ANY(%s)"
    conn.execute(f"UPDATE termdf t SET df = t.df - g.n FROM (SELECT term, count(*) AS n FROM ({gone}) x GROUP BY term) g "
                 "WHERE t.term = g.term", (list(ids),))
    conn.execute(f"DELETE FROM postings p USING ({gone}) g WHERE p.term = g.term AND p.id = g.id", (list(ids),))
    conn.execute("DELETE FROM docterms WHERE id = ANY(%s)", (list(ids),))


def write_postings(conn: Any, chunks: Sequence[Chunk], stem: bool = True) -> None:
    """Store the terms of `chunks` (psycopg connection, inside the writer's transaction), by COPY."""
    if not chunks:
        return
    texts = [c.indexed_text for c in chunks]
    corpus = stem_many(texts) if stem else [word_tokens(t) for t in texts]
    df: Counter[str] = Counter()
    lines: list[str] = []
    per_doc: list[str] = []
    for c, toks in zip(chunks, corpus, strict=True):
        counts = Counter(toks)
        df.update(counts.keys())
        # terms are \w+ (tether.rag._text): nothing in them needs escaping in COPY's text format, and
        # quoted they are array elements as they are (unquoted, "null" would be a NULL)
        terms = ",".join(f'"{t}"' for t in counts)
        tfs = ",".join(map(str, counts.values()))
        per_doc.append(f"{c.id}\t{len(toks)}\t{{{terms}}}\t{{{tfs}}}\n")
        lines += [f"{term}\t{c.id}\t{tf}\t{len(toks)}\n" for term, tf in counts.items()]
    lines.sort()  # in the primary key's order: the server appends to its index instead of jumping around
    # Into an empty table, a large load goes in without the key, which is built once after it (a third
    # faster than a key kept up per row, measured at 1.4 million rows); the table is locked till commit.
    bulk = len(lines) >= BULK and conn.execute("SELECT NOT EXISTS (SELECT 1 FROM postings)").fetchone()[0]
    if bulk:
        conn.execute("ALTER TABLE postings DROP CONSTRAINT postings_pkey")
    with conn.cursor() as cur:
        with cur.copy("COPY postings (term, id, tf, len) FROM STDIN") as copy:
            for start in range(0, len(lines), 20_000):
                copy.write("".join(lines[start : start + 20_000]))
        with cur.copy("COPY docterms (id, len, terms, tfs) FROM STDIN") as copy:
            copy.write("".join(per_doc))
    if bulk:
        conn.execute("ALTER TABLE postings ADD CONSTRAINT postings_pkey PRIMARY KEY (term, id)")
    conn.execute("INSERT INTO termdf (term, df) SELECT * FROM unnest(%s::text[], %s::int[]) "
                 "ON CONFLICT (term) DO UPDATE SET df = termdf.df + EXCLUDED.df", (list(df), list(df.values())))


class ServerBM25:
    """The scores of `like` (a BM25Retriever's k1, b, stemming and RM3) for the passages `ids` (in
    row order, of `generation`), computed by the server; `like.remote` is set to this object's
    `scores`, which raises `_Stale` when the index has moved on."""

    def __init__(self, conn: Any, like: BM25Retriever, ids: Sequence[str], generation: str) -> None:
        self.conn, self.like, self.generation = conn, like, generation
        self.row_of = {cid: row for row, cid in enumerate(ids)}
        self.ids = list(ids)
        n, avgdl = conn.execute("SELECT count(*), coalesce(avg(len), 0) FROM docterms").fetchone()
        self.n = int(n)
        self.avgdl = float(avgdl) if self.n and float(avgdl) else 1.0

    def scores(self, query: str) -> np.ndarray:
        out = np.zeros(len(self.ids), dtype=np.float32)
        counts = Counter(self.like._tokens(query))
        rm3 = self.like.rm3
        params: dict[str, Any] = {"terms": list(counts), "counts": [float(c) for c in counts.values()],
                                  "n": float(self.n), "avgdl": self.avgdl, "k1": self.like.k1, "b": self.like.b}
        if rm3 is not None:
            params.update(docs=rm3.docs, fterms=rm3.terms, original=rm3.original, max_df=rm3.max_df)
        generation = None
        for cid, score in self.conn.execute(SEARCH if rm3 is None else SEARCH_RM3, params).fetchall():
            if cid is None:  # the row that carries the generation the statement saw
                generation = str(int(score or 0))
            elif (row := self.row_of.get(cid)) is not None:
                out[row] = score
        if generation != self.generation:
            raise _Stale
        return out
