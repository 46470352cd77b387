"""`python -m bench.local_model`: the offline task suite with the embedded model at temperature 0.

Every variant runs in a fresh process, in a working directory with a different name. Options:
--gguf PATH (another model), --threads N, --tasks a,b (families), --dev (leave out the held-out
variants, for tuning), --dirname NAME (one directory name for all), --jobs N (variants at once), --out PATH. Writes
bench/local_model/results.json for a full run unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.local_model.harness import run_suite
from bench.local_model.worker import families

HERE = Path(__file__).resolve().parent
BARS = {"calculator": 9 / 10, "read_one_file": 8 / 10, "read_two_files": 5 / 10, "search_support_rag": 5 / 10}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_model", description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="a GGUF file (default: the embedded SmolLM2-135M)")
    parser.add_argument("--threads", type=int, help="llama.cpp threads (default: tether's default)")
    parser.add_argument("--tasks", help="comma-separated families to run (default: all)")
    parser.add_argument("--dev", action="store_true", help="leave out the held-out variants")
    parser.add_argument("--dirname", help="one working-directory name for every variant")
    parser.add_argument("--jobs", type=int, default=1, help="variants run at the same time (default 1)")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    args = parser.parse_args(argv)

    from tether.models._local import LocalModel, LocalModelUnavailable

    try:
        LocalModel(args.gguf, n_threads=args.threads)
    except LocalModelUnavailable as exc:
        print(f"bench.local_model: {exc}", file=sys.stderr)
        return 2
    known = families()
    tasks = list(known.values())
    if args.tasks:
        wanted = [t.strip() for t in args.tasks.split(",") if t.strip()]
        unknown = [w for w in wanted if w not in known]
        if unknown:
            parser.error(f"unknown task(s): {', '.join(unknown)}")
        tasks = [known[w] for w in wanted]
    start = time.perf_counter()
    results = run_suite(tasks, gguf=args.gguf, threads=args.threads, include_held_out=not args.dev,
                        dirname=args.dirname, jobs=args.jobs, progress=lambda line: print(line, file=sys.stderr))
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    if "search_support_rag" not in known:
        results["tasks"]["search_support_rag"] = {"skipped": "tether.rag / examples/support_rag not available"}

    print(f"\n{'family':<20} {'success':>8} {'held-out':>9} {'bar':>5} {'s/task':>7}")
    for name, r in results["tasks"].items():
        if "skipped" in r:
            print(f"{name:<20} {'-':>8}  ({r['skipped']})")
            continue
        bar = BARS.get(name)
        met = "" if bar is None else ("ok" if r["successes"] >= bar * r["variants"] else "MISS")
        print(f"{name:<20} {r['successes']:>3}/{r['variants']:<4} {r['held_out_successes']:>4}/{r['held_out_variants']:<4}"
              f" {met:>5} {r['seconds']:>7.2f}")
    print(f"{results['model']}, {results['n_threads']} thread(s), temperature 0, one process per variant; "
          f"prompt {results['prompt_tokens_per_second']} tok/s, generation "
          f"{results['generation_tokens_per_second']} tok/s, {results['model_calls']} model calls, "
          f"{results['wall_seconds']} s")
    full = not (args.tasks or args.dev or args.dirname)
    out = args.out or (HERE / "results.json" if full else None)
    if out is not None:
        out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
