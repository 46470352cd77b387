"""Ask the research team a question (offline stand-ins by default, or a live model).

    python examples/research_team/run.py
    python examples/research_team/run.py "When did Gamma launch and when did Alpha launch?"
    python examples/research_team/run.py --model openai:gpt-4o-mini "..."
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from team import ask_team, build_index, questions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=questions()[0]["q"])
    parser.add_argument("--model", help="model spec for every role (default: offline stand-ins)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        index = build_index(tmp)
        result = asyncio.run(ask_team(args.question, args.model, index=index))
        index.close()
    print(f"plan: {result.plan}")
    for w in result.workers:
        print(f"  {w.id} {'ok' if w.ok else 'FAILED'}: {w.question} -> {w.answer or w.error}")
    print(f"\n{result.answer}\n")
    print(f"[{result.stop_reason.value}; {result.usage.total_tokens} tokens, ${result.usage.cost_usd:.5f}]",
          file=sys.stderr)
    return 0 if result.completed else 3


if __name__ == "__main__":
    raise SystemExit(main())
