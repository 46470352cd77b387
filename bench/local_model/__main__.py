"""`python -m bench.local_model`: the offline task suite with the embedded model at temperature 0.

Options: --gguf PATH (another model), --threads N, --tasks a,b (subset), --out PATH.
Writes bench/local_model/results.json unless --out says otherwise (or a subset of tasks is run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.local_model.harness import run_suite
from bench.local_model.rag import rag_task
from bench.local_model.tasks import TASKS
from tether.models.local import LocalModel, LocalModelUnavailable

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_model", description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="a GGUF file (default: the embedded SmolLM2-135M)")
    parser.add_argument("--threads", type=int, help="llama.cpp threads (default: the machine's cores)")
    parser.add_argument("--tasks", help="comma-separated task names to run (default: all)")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    args = parser.parse_args(argv)

    try:
        model = LocalModel(args.gguf, n_threads=args.threads, temperature=0.0)
    except LocalModelUnavailable as exc:
        print(f"bench.local_model: {exc}", file=sys.stderr)
        return 2
    tasks = list(TASKS)
    rag = rag_task()
    rag_note = None
    if rag is None:
        rag_note = "skipped: tether.rag / examples/support_rag not available in this checkout"
    else:
        tasks.append(rag[0])
    if args.tasks:
        wanted = {t.strip() for t in args.tasks.split(",") if t.strip()}
        unknown = wanted - {t.name for t in tasks}
        if unknown:
            parser.error(f"unknown task(s): {', '.join(sorted(unknown))}")
        tasks = [t for t in tasks if t.name in wanted]

    print(f"{model.name}, {model.n_threads} thread(s), temperature 0", file=sys.stderr)
    start = time.perf_counter()
    results = run_suite(model, tuple(tasks), rag_tools=rag[1] if rag else None,
                        progress=lambda line: print(line, file=sys.stderr))
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    if rag_note:
        results["tasks"]["search_support_rag"] = {"skipped": rag_note}

    print(f"\n{'task':<20} {'success':>8} {'s/task':>7}")
    for name, r in results["tasks"].items():
        if "skipped" in r:
            print(f"{name:<20} {'-':>8} {'-':>7}  ({r['skipped']})")
        else:
            print(f"{name:<20} {r['successes']:>3}/{r['variants']:<4} {r['seconds']:>7.2f}")
    print(f"prompt {results['prompt_tokens_per_second']} tok/s, generation "
          f"{results['generation_tokens_per_second']} tok/s, {results['model_calls']} model calls, "
          f"{results['wall_seconds']} s")
    out = args.out or (None if args.tasks else HERE / "results.json")
    if out is not None:
        out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
