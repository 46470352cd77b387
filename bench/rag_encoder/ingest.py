"""The first `tether ingest` of 1,400 documents, as a new user runs it: `python -m bench.rag_encoder.ingest`.

The first 1,400 documents of a development collection (default cisi, 1,460 abstracts; Cranfield's
size) are written as text files, then `tether ingest DIR` runs in a child process with an empty
TETHER_HOME and an empty TETHER_CACHE: the encoder's per-CPU decision, the derived graph, every
embedding and the index are all part of it. Reports the child's CPU seconds (user + system, every
thread), its peak RSS (ru_maxrss), wall seconds and the first line it printed (the encoder's path
and why). Writes `first_ingest` into bench/rag_encoder/results.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def first_ingest(collection: str, documents: int, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Ingest the collection's first `documents` in a child with an empty TETHER_HOME and TETHER_CACHE
    (and `extra_env`, e.g. bench.rag_encoder.avx2_native's LD_PRELOAD): its CPU s, peak RSS, first line."""
    from bench.retrieval.__main__ import data_dir

    corpus = data_dir() / collection / "corpus.jsonl"
    docs = [json.loads(line) for line in corpus.read_text().splitlines()[:documents]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        for d in docs:
            title = d.get("title") or ""
            (folder / f"{re.sub(r'[^A-Za-z0-9_-]', '_', str(d['_id'] if '_id' in d else d['id']))}.txt").write_text(
                (title + "\n\n" if title else "") + d["text"])
        env = {**os.environ, "TETHER_HOME": str(Path(tmp) / "home"), "TETHER_CACHE": str(Path(tmp) / "cache"),
               "PYTHONPATH": str(REPO / "src"), **(extra_env or {})}
        for k in ("TETHER_EMBED_MODEL", "TETHER_EMBED_INT8"):
            env.pop(k, None)
        load_before = round(os.getloadavg()[0], 2)
        wall = time.perf_counter()
        with open(Path(tmp) / "out", "w+") as so, open(Path(tmp) / "err", "w+") as se:
            child = subprocess.Popen([sys.executable, "-m", "tether", "ingest", str(folder), "--index", "bench"],
                                     env=env, stdout=so, stderr=se, text=True)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, not the max over all children
            child.returncode = os.waitstatus_to_exitcode(status)
            so.seek(0)
            se.seek(0)
            out = subprocess.CompletedProcess(child.args, child.returncode, so.read(), se.read())
        wall = time.perf_counter() - wall
        if out.returncode:
            raise SystemExit(out.stderr[-2000:])
        found = next(Path(tmp, "cache", "models").glob("path-*.json"), None)
        decision = json.loads(found.read_text()) if found else None
    lines = out.stderr.strip().splitlines()
    first = " ".join([lines[0], *(x.strip() for x in itertools.takewhile(lambda x: x.startswith("  "), lines[1:]))]) \
        if lines else ""  # the first message, unwrapped
    row = {"collection": collection, "documents": len(docs),
           "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
           "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "wall_seconds": round(wall, 1),
           "first_line": first, "result": out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "",
           "decision": decision,
           "load_average_1m": [load_before, round(os.getloadavg()[0], 2)],
           "bars": {}}
    row["bars"] = {"<= 60 CPU s": row["cpu_seconds"] <= 60, "<= 400 MB": row["peak_rss_mb"] <= 400}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", default="cisi")
    ap.add_argument("--documents", type=int, default=1400)
    args = ap.parse_args(argv)
    row = {"command": f"python -m bench.rag_encoder.ingest --collection {args.collection} --documents {args.documents}",
           **first_ingest(args.collection, args.documents)}
    path = HERE / "results.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored["first_ingest"] = row
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
