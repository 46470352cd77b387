"""Known-item collections kept as data (gzip'd JSON lines of id, query, text): one relevant
document per query, written once from their source and read the same on every machine."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tether.rag._evaluate import Collection


def write(path: Path, items: list[tuple[str, str, str]]) -> int:
    """Write (id, query, text) rows to `path`, byte-identical for the same rows; how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"id": i, "query": q, "text": b}) + "\n" for i, q, b in items)
    path.write_bytes(gzip.compress(lines.encode(), mtime=0))
    return len(items)


def read(path: Path, query_step: int = 3) -> Collection:
    """The collection in `path`: every row a document, every `query_step`-th row's query a query."""
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    queries = {r["id"]: r["query"] for n, r in enumerate(rows) if n % query_step == 0}
    return Collection([r["id"] for r in rows], [r["text"] for r in rows], queries, {q: {q: 1} for q in queries})
