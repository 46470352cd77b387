"""A held-out collection for `best`: manual pages (known-item search), committed as data.

`python -m bench.rag_encoder.manpages --build` reads the English section 1 and 8 pages under
/usr/share/man (gzipped roff; `.so` redirects skipped) and writes bench/rag_encoder/data/
manpages.jsonl.gz; the bench reads only that file, so CI (whose /usr/share/man differs) scores the
same collection. Per page: the query is the NAME line's description (after `\\-`, 4 to 30 words),
the one relevant document is the DESCRIPTION section with roff markup stripped, cut at 300 words
(pages whose description has under 30 words are dropped). Pages whose query or document occurs more
than once, or whose query occurs verbatim in its document, are dropped; every `step`-th page (by
path) is kept, every third of those is a query. Built after `best`'s change was fixed, never tuned on.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from pathlib import Path

from bench.rag_encoder import known_items
from tether.rag._evaluate import Collection

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "manpages.jsonl.gz"
TEXT_MACROS = {"B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB", "IP", "TP", "HP"}


def _plain(line: str) -> str:
    line = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", line)
    line = re.sub(r"\\\*?\((..)", " ", line)
    line = re.sub(r"\\\*\[[^\]]*\]", " ", line)
    line = re.sub(r"\\s[-+]?\d", "", line)
    line = line.replace("\\-", "-").replace("\\e", "\\")
    line = re.sub(r"\\[&|^ 0:%~/,]", " ", line)
    return line.replace('"', " ")


def parse(raw: str) -> tuple[str, str] | None:
    """(query, document) of one page's roff source, or None when it lacks either."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in raw.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        m = re.match(r"\.S[Hh]\s+(.*)", line)
        if m:
            current = m.group(1).strip().strip('"').upper()
            sections.setdefault(current, [])
            continue
        if current is None:
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            if not parts or parts[0] not in TEXT_MACROS or len(parts) < 2:
                continue
            line = parts[1]
        sections[current].append(_plain(line))
    name = " ".join(" ".join(sections.get("NAME", [])).split())
    if " - " not in name:
        return None
    query = name.split(" - ", 1)[1].strip()
    body = " ".join(" ".join(sections.get("DESCRIPTION", [])).split())
    if not 4 <= len(query.split()) <= 30 or len(body.split()) < 30:
        return None
    return query, " ".join(body.split()[:300])


def pages(root: Path = Path("/usr/share/man")) -> list[tuple[str, str, str]]:
    found = []
    for sec in ("man1", "man8"):
        for path in sorted((root / sec).glob("*.gz")):
            try:
                raw = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
            except (OSError, EOFError):
                continue
            if raw.lstrip().startswith(".so ") or path.is_symlink():
                continue
            got = parse(raw)
            if got and got[0] not in got[1]:
                found.append((f"{sec}/{path.name.removesuffix('.gz')}", *got))
    queries = Counter(q for _, q, _ in found)
    bodies = Counter(b for _, _, b in found)
    return [f for f in found if queries[f[1]] == 1 and bodies[f[2]] == 1]


def build_data(step: int) -> int:
    return known_items.write(DATA, pages()[::step])


def build(query_step: int = 3) -> Collection:
    return known_items.read(DATA, query_step)


def describe(col: Collection) -> dict:
    return {"source": "manual pages, sections 1 and 8 (bench/rag_encoder/manpages.py; data/manpages.jsonl.gz)",
            "documents": len(col.doc_ids), "queries": len(col.queries), "relevant_per_query": 1}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="rebuild the data file from /usr/share/man")
    ap.add_argument("--step", type=int, default=1)
    args = ap.parse_args()
    if args.build:
        print(build_data(args.step), "pages written")
    print(json.dumps(describe(build())))
