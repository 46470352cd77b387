"""A development collection for tuning `best`: docstrings of the third-party packages in tether's venv.

Built like bench/rag_encoder/stdlib_docs.py (same rules: summary = query, body = the one relevant
document, known-item search), over the site-packages of the running interpreter instead of the
standard library. Docstrings that also occur in the standard library (vendored copies) are dropped,
so nothing of the held-out stdlib collection leaks into tuning. Every `step`-th docstring (in id
order) is kept, every `query_step`-th of those is a query. Deterministic for one lock file
(the package versions are recorded in the results).
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from bench.rag_encoder import stdlib_docs
from tether.rag._evaluate import Collection

SKIP_PACKAGES = ("tether", "pip", "setuptools", "_distutils_hack", "pkg_resources")


def docstrings() -> list[tuple[str, str, str]]:
    root = Path(sysconfig.get_paths()["purelib"])
    std = stdlib_docs.docstrings()
    seen = {s for _, s, _ in std} | {b for _, _, b in std}
    return [f for f in stdlib_docs.docstrings(root)
            if f[0].split(".")[0] not in SKIP_PACKAGES and f[1] not in seen and f[2] not in seen]


def build(step: int = 3, query_step: int = 3) -> Collection:
    items = docstrings()[::step]
    queries = {i: s for n, (i, s, _) in enumerate(items) if n % query_step == 0}
    return Collection([i for i, _, _ in items], [b for _, _, b in items], queries, {q: {q: 1} for q in queries})


def describe(col: Collection) -> dict:
    packages = sorted({i.split(".")[0] for i in col.doc_ids})
    return {"source": "docstrings of the third-party packages in tether's venv (bench/rag_encoder/venv_docs.py)",
            "documents": len(col.doc_ids), "queries": len(col.queries), "relevant_per_query": 1,
            "packages": packages}


if __name__ == "__main__":
    c = build()
    print(json.dumps(describe(c)))
    for q in list(c.queries)[:5]:
        print(q, "|", c.queries[q], "|", c.doc_texts[c.doc_ids.index(q)][:120])
