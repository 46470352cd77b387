"""`python -m bench.ask_extractive`: `tether ask` with the embedded model, extractive vs the old paths.

A held-out question set (questions.json: 44 questions whose answer text appears verbatim in one of
the eight documents of docs/, 8 whose answer is in none) over an index of docs/ built as `tether
ingest` builds it (retriever `best`, top 5 passages per question). Written once and run as is:
nothing in tether was tuned on it. Reported per variant: the share of answerable questions whose
answer contains the answer text, the share of unanswerable ones answered "not found in the index",
and seconds per answer (retrieval included, the index build not).

Tuning used only the development set, dev/ (`--dev`: 4 other documents, 25 questions).

Variants: `extractive` (the sentence scorer alone, what `tether ask` does with the tiny model),
`extractive+choice` (the embedded model picks among the scorer's top 3, its reply held to their
numbers by a grammar), `pipeline` (the old `ask --pipeline`: one tool-free call of the embedded
model over the passages), `agentic` (the old default, the model calling the search tool; only with
--agentic N, on the first N questions, each capped at --cap seconds: it took 142-579 s a question).
Writes bench/ask_extractive/results.json unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _contains(answer: str, expected: str) -> bool:
    return expected.lower() in answer.lower()


def _abstained(answer: str) -> bool:
    from tether.rag._extract import NOT_FOUND
    from tether.rag._prompt import NO_ANSWER

    low = answer.lower()
    return NOT_FOUND in low or NO_ANSWER in low or "does not contain" in low or "do not contain" in low


def _score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    answerable = [r for r in rows if r["expected"] is not None]
    unanswerable = [r for r in rows if r["expected"] is None]
    seconds = [r["seconds"] for r in rows]
    return {
        "questions": len(rows),
        "answer_contains_text": round(sum(r["correct"] for r in answerable) / len(answerable), 4) if answerable else None,
        "answerable": len(answerable),
        "not_found_when_absent": round(sum(r["correct"] for r in unanswerable) / len(unanswerable), 4)
        if unanswerable else None,
        "unanswerable": len(unanswerable),
        "seconds_per_answer_mean": round(statistics.mean(seconds), 4) if seconds else None,
        "seconds_per_answer_median": round(statistics.median(seconds), 4) if seconds else None,
        "seconds_per_answer_max": round(max(seconds), 4) if seconds else None,
    }


def _run(name: str, questions: list[dict[str, Any]], answer: Callable[[str], str]) -> dict[str, Any]:
    rows = []
    for item in questions:
        start = time.perf_counter()
        try:
            text = answer(item["q"])
        except Exception as exc:  # a failed answer counts as wrong, with its reason kept
            text = f"ERROR {type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        expected = item["a"]
        correct = _contains(text, expected) if expected is not None else _abstained(text)
        rows.append({"q": item["q"], "expected": expected, "answer": text[:400], "correct": correct,
                     "seconds": round(seconds, 4)})
        print(f"{name}: {'ok ' if correct else 'MISS'} {seconds:6.2f}s {item['q']}", file=sys.stderr)
    return {"summary": _score(rows), "answers": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ask_extractive", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="extractive,extractive+choice,pipeline",
                        help="comma list of extractive, extractive+choice, pipeline, agentic")
    parser.add_argument("--agentic", type=int, default=0, help="run the agentic mode on the first N questions")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds per agentic answer (default 120)")
    parser.add_argument("--k", type=int, default=5, help="passages per question (default 5, as `tether ask`)")
    parser.add_argument("--dev", action="store_true", help="the development set (dev/: for tuning; never "
                        "written to results.json)")
    parser.add_argument("--out", type=Path, help="where to write the JSON (default results.json, none with --dev)")
    args = parser.parse_args(argv)
    data = HERE / "dev" if args.dev else HERE
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.agentic and "agentic" not in variants:
        variants.append("agentic")
    questions = json.loads((data / "questions.json").read_text())

    os.environ["TETHER_HOME"] = home = tempfile.mkdtemp(prefix="bench-ask-")
    from tether._limits import Limits
    from tether.rag import Index
    from tether.rag._answer import agentic, pipeline
    from tether.rag._extract import achoose, extract_answer

    start = time.perf_counter()
    idx = Index.open(Path(home) / "index")
    idx.ingest(data / "docs")
    idx.search("warm up", 1)  # the dense encoder loads once, as in one `tether ask` process
    index_seconds = time.perf_counter() - start

    model: Any = None
    if any(v != "extractive" for v in variants):
        from tether.models._local import LocalModel, LocalModelUnavailable

        try:
            model = LocalModel()
            model.load()
        except LocalModelUnavailable as exc:
            print(f"bench.ask_extractive: {exc}; only the extractive variant runs", file=sys.stderr)
            variants = ["extractive"]

    k = args.k
    answerers: dict[str, Callable[[str], str]] = {
        "extractive": lambda q: extract_answer(q, idx.search(q, k)).text(),
        "extractive+choice": lambda q: asyncio.run(achoose(extract_answer(q, idx.search(q, k)), model)).text(),
        "pipeline": lambda q: pipeline(q, idx, model, k=k).answer,
        "agentic": lambda q: agentic(q, idx, model, k=k, limits=Limits(max_steps=6, max_seconds=args.cap)).answer,
    }
    results: dict[str, Any] = {}
    for name in variants:
        chosen = questions[: args.agentic] if name == "agentic" else questions
        results[name] = _run(name, chosen, answerers[name])
    idx.close()

    out = {
        "command": "python -m bench.ask_extractive " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "index": {"documents": len(list((data / "docs").glob("*.md"))), "retriever": "best",
                  "build_seconds": round(index_seconds, 3)},
        "k": k,
        "summary": {name: r["summary"] for name, r in results.items()},
        "variants": results,
    }
    out_path = args.out or (None if args.dev else HERE / "results.json")
    if out_path is not None:
        out_path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(out["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
