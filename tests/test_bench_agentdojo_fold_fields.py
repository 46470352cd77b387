"""`python -m bench.agentdojo.fold_fields`: the per-field runs folded into results.json's `ask_fewer`, the
figures before kept beside, and folding again changes nothing (the committed figures can be regenerated)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's bench/ package

from bench.agentdojo.fold_fields import CLASSIFICATIONS, CLEAN_KEYS, HELDOUT_KEYS, changed, fold


def _clean(n: int) -> dict[str, dict[str, int]]:
    return {c: dict.fromkeys(CLEAN_KEYS, n) for c in CLASSIFICATIONS}


def _write(parts: Path) -> None:
    parts.mkdir()
    clean = {"suites": {"banking": {c: {"hidden": {"clean": dict.fromkeys(CLEAN_KEYS, 2),
                                                   "prompt_reasons": {"egress": 2}}} for c in CLASSIFICATIONS}}}
    timing = {"agentdojo": {"pairs": 3, "attacker_calls_executed": 0, "note": "x"}, "adaptive": {"pairs": 2},
              "hidden_adaptive": {"a": {"pairs": 1, "attacker_calls_executed": 0}}}
    atk = {"seconds": 9.5, "suites": {"banking": {c: {"hidden": {"timings": {"immediate": timing, "interleaved": timing}}}
                                                  for c in CLASSIFICATIONS}}}
    held = {"defended": {c: {"hidden": {"immediate": dict.fromkeys(HELDOUT_KEYS, 1)}} for c in CLASSIFICATIONS}}
    for name, data in (("clean_banking", clean), ("atk_banking", atk), ("heldout_0-20", held)):
        (parts / f"{name}.json").write_text(json.dumps(data))


def test_the_runs_are_folded_beside_the_figures_before_and_folding_again_changes_nothing(tmp_path: Path) -> None:
    _write(tmp_path / "out")
    suites = ("banking", "travel", "slack")
    results: dict[str, Any] = {"other": 1, "ask_fewer": {
        "clean": {s: _clean(5) for s in suites}, "clean_totals": {c: {} for c in CLASSIFICATIONS},
        "prompt_reasons": {s: {c: {"egress": 5} for c in CLASSIFICATIONS} for s in suites}}}
    once = fold(results, tmp_path / "out")
    a = once["ask_fewer"]
    assert results["ask_fewer"]["clean"]["banking"]["bench"]["approval_prompts"] == 5  # the input is not changed
    assert a["clean"]["banking"]["bench"]["approval_prompts"] == 2
    assert a["clean"]["banking"]["bench"]["approval_prompts_before_fields"] == 5
    assert a["clean"]["travel"]["docstrings"]["queries_before_fields"] == 5  # not re-run: the same before and after
    assert a["clean_before_fields"]["banking"]["bench"]["approval_prompts"] == 5
    assert a["clean_totals"]["docstrings"]["utility_oracle"] == 2 + 5 + 5
    assert a["prompt_reasons"]["banking"]["bench"] == {"egress": 2}
    assert a["prompt_reasons_before_fields"]["banking"]["bench"] == {"egress": 5}
    part = a["attacked_per_field"]["atk_banking_bench"]
    assert part["pairs"] == 10 and part["hidden_adaptive"]["pairs"] == 2 and part["seconds"] == 9.5
    assert part["timings"] == ["immediate", "interleaved"]
    assert a["attacked_per_field_totals"]["bench"]["pairs"] == 10
    assert a["attacked_per_field_totals"]["bench"]["hidden_adaptive_pairs"] == 2
    assert a["heldout_per_field"]["docstrings"]["model_taken_over"] == 1
    assert a["heldout_per_field"]["docstrings"]["parts"] == ["0-20"]
    assert once["other"] == 1
    again = fold(once, tmp_path / "out")
    assert changed(once, again) == [] and again == once
