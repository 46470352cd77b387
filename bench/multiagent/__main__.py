"""Single agent vs orchestrator-worker on 10 research questions, side by side in one run.

    python -m bench.multiagent                       # offline stand-ins (deterministic), writes results.json
    python -m bench.multiagent --model openai:gpt-4o-mini

The questions (examples/research_team/questions.json) each ask for two or three facts from different
documents; success means every expected fact is in the answer. Offline, every role is the example's
deterministic stand-in (search, then quote the best-matching sentence; the planner splits on "and"
and commas), with tokens counted as OpenAI's tokenizer would and priced at gpt-4o-mini's list price:
the figures show what the structure itself costs and gains with a model that does exactly one
search per task, not what a live model would do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "research_team"))

from team import ask_team, build_index, questions, single_agent  # noqa: E402

from tether import Limits  # noqa: E402


def _ok(answer: str, expect: list[str]) -> bool:
    return all(e.lower() in answer.lower() for e in expect)


async def measure(model: str | None) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        index = build_index(tmp)
        await single_agent(model, index=index).arun("warm up: what is Alpha?")  # loads the tokenizer once
        for item in questions():
            t0 = time.perf_counter()
            single = await single_agent(model, index=index).arun(item["q"])
            t1 = time.perf_counter()
            team = await ask_team(item["q"], model, index=index, limits=Limits(max_tokens=40_000))
            t2 = time.perf_counter()
            rows.append({
                "question": item["q"],
                "single": {"ok": _ok(single.answer, item["expect"]), "tokens": single.usage.total_tokens,
                           "cost_usd": round(single.usage.cost_usd, 6), "seconds": round(t1 - t0, 3),
                           "model_calls": single.usage.model_calls},
                "team": {"ok": _ok(team.answer, item["expect"]), "tokens": team.usage.total_tokens,
                         "cost_usd": round(team.usage.cost_usd, 6), "seconds": round(t2 - t1, 3),
                         "model_calls": team.usage.model_calls, "workers": len(team.workers),
                         "failed_workers": len(team.failed_workers)},
            })
        index.close()
    total = {k: {"success": sum(r[k]["ok"] for r in rows), "tokens": sum(r[k]["tokens"] for r in rows),
                 "cost_usd": round(sum(r[k]["cost_usd"] for r in rows), 6),
                 "seconds": round(sum(r[k]["seconds"] for r in rows), 3)} for k in ("single", "team")}
    ratio = {m: round(total["team"][m] / total["single"][m], 2) if total["single"][m] else None
             for m in ("tokens", "cost_usd", "seconds")}
    return {"model": model or "offline stand-ins (extractive, counted as gpt-4o-mini)", "questions": len(rows),
            "total": total, "team_over_single": ratio, "load_average": os.getloadavg(), "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = parser.parse_args()
    out = asyncio.run(measure(args.model))
    t = out["total"]
    print(f"{'':8} {'success':>8} {'tokens':>8} {'cost $':>9} {'seconds':>8}")
    for k in ("single", "team"):
        print(f"{k:8} {t[k]['success']:>5}/{out['questions']} {t[k]['tokens']:>8} {t[k]['cost_usd']:>9.5f} "
              f"{t[k]['seconds']:>8.2f}")
    print(f"team/single: {out['team_over_single']}  (load {out['load_average'][0]:.1f})")
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
