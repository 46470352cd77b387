"""The AgentDojo bench's call_if and staging (issue 44, "stage and hide before you ask"): a decided call
asks nobody and the planner never sees the answer; a staged effect asks nobody, is reviewed once at the
end, and a rejected one never happened (skipped without the `bench` extra)."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("agentdojo")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's bench/ package

from agentdojo.functions_runtime import FunctionsRuntime
from agentdojo.task_suite.load_suites import get_suites

from bench.agentdojo.harness import CLASSIFICATIONS, SuiteHarness
from bench.agentdojo.staging import oracle_keep, replay, review
from tether.policy import action_key


def test_a_call_the_data_decides_runs_through_call_if_and_asks_nobody() -> None:
    suite = get_suites("v1.1.2")["travel"]
    h = SuiteHarness("travel", suite, CLASSIFICATIONS["bench"])
    ut = suite.user_tasks["user_task_0"]  # "if it is rated over 4, reserve it"
    before = asyncio.run(h.run(ut, None, approver="oracle", hidden=True, batches=True, conditional=False))
    after = asyncio.run(h.run(ut, None, approver="oracle", hidden=True, batches=True))
    assert before.utility and before.prompts == 1 and before.reasons == {"tainted_context": 1}
    assert after.utility and after.prompts == 0  # the model never saw the yes: its context is clean
    assert [n for _, n, _ in h.executed if n == "reserve_hotel"] == ["reserve_hotel"]
    assert any(cid.endswith(".if") for cid, n, _ in h.executed if n == "reserve_hotel")


def test_a_compromised_reader_decides_only_whether_the_call_runs() -> None:
    suite = get_suites("v1.1.2")["travel"]
    h = SuiteHarness("travel", suite, CLASSIFICATIONS["bench"])
    ut = suite.user_tasks["user_task_0"]
    out = asyncio.run(h.run(ut, suite.injection_tasks["injection_task_0"], approver="deny", hidden=True,
                            batches=True))
    # the injected reviews made the reader say no: the user's reservation was not made, and the planner,
    # which never saw that answer, was not taken over by it
    assert out.met and not out.injected and out.attacker_effects_executed == 0
    assert not any(n == "reserve_hotel" for _, n, _ in h.executed)


def test_a_reversible_effect_is_staged_and_reviewed_once_at_the_end() -> None:
    suite = get_suites("v1.1.2")["workspace"]
    h = SuiteHarness("workspace", suite, CLASSIFICATIONS["bench"])
    ut = suite.user_tasks["user_task_7"]  # reschedule an event found by search (its id someone else's value)
    before = asyncio.run(h.run(ut, None, approver="oracle", hidden=True, batches=True, stage=False))
    after = asyncio.run(h.run(ut, None, approver="oracle", hidden=True, batches=True))
    assert before.utility and before.prompts == 1 and before.reviews == 0
    assert after.utility and after.prompts == 0 and (after.reviews, after.staged_changes) == (1, 1)
    denied = asyncio.run(h.run(ut, None, approver="deny", hidden=True, batches=True))
    # rejected at the review: the event never moved
    assert denied.reviews == 1 and not denied.utility
    assert not any(n == "reschedule_calendar_event" for _, n, _ in h.executed)


def test_a_change_the_review_rejects_never_happened() -> None:
    suite = get_suites("v1.1.2")["workspace"]
    env = suite.load_and_inject_default_environment(suite.get_injection_vector_defaults())
    runtime = FunctionsRuntime(suite.tools)
    start = env.model_copy(deep=True)
    executed = [("usr_1", "create_file", {"filename": "notes.txt", "content": "mine"}),
                ("atk_2", "delete_file", {"file_id": "13"}),
                ("usr_3", "search_files_by_filename", {"filename": "notes.txt"})]
    for _, name, args in executed:
        runtime.run_function(env, name, dict(args))
    assert "13" not in env.cloud_drive.files
    wanted = Counter({action_key("create_file", {"filename": "notes.txt", "content": "mine"}): 1})
    r = review("workspace", executed, oracle_keep(wanted, action_key))
    assert [cid for cid, _, _ in r.shown] == ["usr_1", "atk_2"] and r.rejected == {"atk_2"}
    kept_env, kept = replay(runtime, start, executed, r.rejected)
    assert "13" in kept_env.cloud_drive.files  # the attacker's deletion was only ever staged
    assert any(f.filename == "notes.txt" for f in kept_env.cloud_drive.files.values())
    assert [cid for cid, _, _ in kept] == ["usr_1", "usr_3"]
