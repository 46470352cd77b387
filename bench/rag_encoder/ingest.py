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
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def main(argv: list[str] | None = None) -> int:
    from bench.retrieval.__main__ import data_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", default="cisi")
    ap.add_argument("--documents", type=int, default=1400)
    args = ap.parse_args(argv)
    corpus = data_dir() / args.collection / "corpus.jsonl"
    docs = [json.loads(line) for line in corpus.read_text().splitlines()[: args.documents]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        for d in docs:
            title = d.get("title") or ""
            (folder / f"{re.sub(r'[^A-Za-z0-9_-]', '_', str(d['_id'] if '_id' in d else d['id']))}.txt").write_text(
                (title + "\n\n" if title else "") + d["text"])
        env = {**os.environ, "TETHER_HOME": str(Path(tmp) / "home"), "TETHER_CACHE": str(Path(tmp) / "cache"),
               "PYTHONPATH": str(REPO / "src")}
        for k in ("TETHER_EMBED_MODEL", "TETHER_EMBED_INT8"):
            env.pop(k, None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "tether", "ingest", str(folder), "--index", "bench"],
                             env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode:
            raise SystemExit(out.stderr[-2000:])
        found = next(Path(tmp, "cache", "models").glob("path-*.json"), None)
        decision = json.loads(found.read_text()) if found else None
    first = out.stderr.strip().splitlines()[0] if out.stderr.strip() else ""
    row = {"collection": args.collection, "documents": len(docs),
           "command": f"python -m bench.rag_encoder.ingest --collection {args.collection} --documents {args.documents}",
           "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
           "peak_rss_mb": round(after.ru_maxrss / 1024, 1), "wall_seconds": round(wall, 1),
           "first_line": first, "result": out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "",
           "decision": decision,
           "load_average_1m": round(os.getloadavg()[0], 2),
           "bars": {}}
    row["bars"] = {"<= 60 CPU s": row["cpu_seconds"] <= 60, "<= 400 MB": row["peak_rss_mb"] <= 400}
    path = HERE / "results.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored["first_ingest"] = row
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
