"""A retrieval collection none of tether's settings were tuned on, built from Python's own sources.

Every function, class and module docstring of the standard library (the running interpreter's,
read with `ast`, never imported; tests, idlelib, tkinter, lib2to3, turtledemo and ensurepip left
out) whose first paragraph (the summary) has 5 to 30 words and whose remaining paragraphs (the
body) have 30 to 400 words becomes one document (its body) and one query (its summary); the only
document judged relevant to a query is its own body (known-item search, relevance 1). Docstrings
whose summary or body occurs more than once, or whose summary appears verbatim in its body, are
dropped. Of what is left, every `step`-th (in id order) is kept as a document and every
`query_step`-th of those as a query, so the other documents are distractors. Deterministic for one
Python version (recorded in the results).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import sysconfig
from collections import Counter
from pathlib import Path

from tether.rag._evaluate import Collection

SKIP = ("test", "tests", "idlelib", "tkinter", "lib2to3", "turtledemo", "ensurepip", "site-packages", "__pycache__")


def _paragraphs(doc: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc) if p.strip()]


def docstrings(root: Path | None = None) -> list[tuple[str, str, str]]:
    """(id, summary, body) of every docstring under the stdlib `root` that fits the rules above."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, str, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP or part.startswith("test_") for part in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(rel.with_suffix("").parts)
        todo: list[tuple[str, ast.AST]] = [(module, tree)]
        while todo:
            name, node = todo.pop()
            doc = ast.get_docstring(node, clean=True) if isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None
            if doc:
                paras = _paragraphs(doc)
                if len(paras) >= 2:
                    summary, body = paras[0], " ".join(paras[1:])
                    if 5 <= len(summary.split()) <= 30 and 30 <= len(body.split()) <= 400 and summary not in body:
                        found.append((name, summary, body))
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    todo.append((f"{name}.{child.name}", child))
    summaries = Counter(s for _, s, _ in found)
    bodies = Counter(b for _, _, b in found)
    return sorted(f for f in found if summaries[f[1]] == 1 and bodies[f[2]] == 1)


def build(step: int = 1, query_step: int = 3) -> Collection:
    items = docstrings()[::step]
    queries = {i: s for n, (i, s, _) in enumerate(items) if n % query_step == 0}
    return Collection([i for i, _, _ in items], [b for _, _, b in items], queries, {q: {q: 1} for q in queries})


def describe(col: Collection) -> dict:
    return {"source": f"Python {sys.version.split()[0]} standard library docstrings (bench/rag_encoder/stdlib_docs.py)",
            "documents": len(col.doc_ids), "queries": len(col.queries), "relevant_per_query": 1}


if __name__ == "__main__":
    c = build()
    print(json.dumps(describe(c)))
    for q in list(c.queries)[:5]:
        print(q, "|", c.queries[q], "|", c.doc_texts[c.doc_ids.index(q)][:120])
