"""The research-team example runs offline: a plan, cited findings, the team's usage within its limit."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "research_team"))

from team import ask_team, build_index  # noqa: E402

from tether import Limits  # noqa: E402


def test_the_example_team_answers_a_two_part_question_with_citations(tmp_path) -> None:
    index = build_index(tmp_path / "idx")
    try:
        result = asyncio.run(ask_team("When did Gamma launch and when did Alpha launch?", index=index,
                                      limits=Limits(max_tokens=20_000)))
    finally:
        index.close()
    assert result.completed, result.error
    assert len(result.plan) == 2 and all(w.ok for w in result.workers)
    assert "2023. [W1]" in result.answer and "2019. [W2]" in result.answer
    assert result.bad_citations == []
    assert 0 < result.usage.total_tokens <= 20_000 and result.usage.cost_usd > 0
