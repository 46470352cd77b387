"""A development collection for tuning `best`: docstrings of third-party packages, committed as data.

`python -m bench.rag_encoder.venv_docs --rebuild` reads the site-packages of the running interpreter
(tether's venv) and writes bench/rag_encoder/data/venv_docs.jsonl.gz; the bench reads only that file,
so a package installed in one venv (or CI's) does not change the collection or miss the vector cache.
Built like bench/rag_encoder/stdlib_docs.py (same rules: summary = query, body = the one relevant
document, known-item search). Docstrings that also occur in the standard library (vendored copies)
are dropped, so nothing of the held-out stdlib collection leaks into tuning. Every `step`-th docstring
(in id order) is kept, every `query_step`-th of those is a query. The packages it was built from are
listed in `describe`.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from bench.rag_encoder import known_items, stdlib_docs
from tether.rag._evaluate import Collection

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "venv_docs.jsonl.gz"
SKIP_PACKAGES = ("tether", "pip", "setuptools", "_distutils_hack", "pkg_resources")


def docstrings() -> list[tuple[str, str, str]]:
    """(id, summary, body) of the running venv's third-party docstrings (what `--rebuild` reads)."""
    root = Path(sysconfig.get_paths()["purelib"])
    std = stdlib_docs.docstrings()
    seen = {s for _, s, _ in std} | {b for _, _, b in std}
    return [f for f in stdlib_docs.docstrings(root)
            if f[0].split(".")[0] not in SKIP_PACKAGES and f[1] not in seen and f[2] not in seen]


def build_data(step: int = 3) -> int:
    return known_items.write(DATA, docstrings()[::step])


def build(query_step: int = 3) -> Collection:
    return known_items.read(DATA, query_step)


def describe(col: Collection) -> dict:
    packages = sorted({i.split(".")[0] for i in col.doc_ids})
    return {"source": "docstrings of third-party packages (bench/rag_encoder/venv_docs.py; data/venv_docs.jsonl.gz)",
            "documents": len(col.doc_ids), "queries": len(col.queries), "relevant_per_query": 1,
            "packages": packages}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="rebuild the data file from this venv's site-packages")
    ap.add_argument("--step", type=int, default=3)
    args = ap.parse_args()
    if args.rebuild:
        print(build_data(args.step), "docstrings written")
    c = build()
    print(json.dumps(describe(c)))
