"""Leaks and breaks (issue: ceilings that survive crashes...): approvals of abandoned runs expire, old
import paths keep working with a warning, the critic is public, a model reused across event loops
closes its connections quietly, and the durable runner needs no private DBOS name to import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from hang import HANG

from tether.policy import ApprovalBook, PendingApprover
from tether.policy._approvals import ApprovalRequest

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _request(run_id: str, n: int = 0) -> ApprovalRequest:
    return ApprovalRequest(run_id=run_id, user="alice", tool="pay", arguments={"n": n}, key=f"pay:{n}",
                           description="pay", reason="irreversible")


async def _park(approver: PendingApprover, runs: range) -> None:
    for i in runs:
        await approver.request(_request(f"run{i}"))


def test_pending_approvals_of_abandoned_runs_expire() -> None:
    import asyncio

    clock = FakeClock()
    book = ApprovalBook(ttl=3600, clock=clock)
    approver = PendingApprover(book)
    asyncio.run(_park(approver, range(1_000)))  # 1,000 runs parked, then abandoned
    assert len(book.pending) == 1_000
    clock.t = 3601
    asyncio.run(_park(approver, range(1_000, 1_001)))
    assert list(book.pending) == [("run1000", "pay:0")]
    book.grant("pay", {"n": 1}, "bob", run_id="run1000")
    clock.t = 7300
    book.add_pending(_request("run2000"))
    assert book.take("run1000", "pay:1") is None  # the run's unused decision expired too
    book.forget("run2000")
    assert book.pending == {}


def test_pending_approvals_are_capped() -> None:
    book = ApprovalBook(max_pending=100, clock=FakeClock())
    for i in range(1_000):
        book.add_pending(_request(f"run{i}"))
    assert len(book.pending) == 100 and ("run999", "pay:0") in book.pending and ("run0", "pay:0") not in book.pending


def test_an_old_module_path_still_imports_with_a_warning_at_the_importing_line() -> None:
    sys.modules.pop("tether.models.scripted", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from tether.models.scripted import ScriptedModel  # the path before the rename
    from tether.models import ScriptedModel as public

    assert ScriptedModel is public
    [warning] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert "tether.models.scripted is deprecated" in str(warning.message) and "from tether.models" in str(warning.message)
    assert warning.filename == __file__


def test_the_changelog_states_the_deprecation_rule_and_when_aliases_go() -> None:
    from tether._compat import REMOVED_IN

    text = (ROOT / "CHANGELOG.md").read_text()
    assert "tether.models.scripted" in text and REMOVED_IN in text and "one minor version" in text


def test_the_critic_is_public() -> None:
    import tether
    from tether import Critic, run_with_critic

    assert run_with_critic.__module__ == "tether._critic" and Critic in vars(tether).values()


REUSE = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from fake_openai_server import FakeOpenAIServer, chat_completion
from tether._types import Message, ModelRequest
from tether.models import OpenAICompatModel

with FakeOpenAIServer([chat_completion("one"), chat_completion("two"), chat_completion("three")]) as server:
    model = OpenAICompatModel("gpt-4o-mini", base_url=server.base_url, api_key="x")
    request = ModelRequest([Message.user("hi")], [])
    for _ in range(3):
        print(asyncio.run(model.complete(request)).text)
    import gc
    gc.collect()
"""


def test_a_model_reused_across_event_loops_closes_its_connections_quietly() -> None:
    proc = subprocess.run([sys.executable, "-c", REUSE.format(tests=str(ROOT / "tests"))], capture_output=True,
                          text=True, timeout=HANG)
    assert proc.stdout.split() == ["one", "two", "three"], proc.stderr
    assert "Event loop is closed" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


NO_PRIVATE_DBOS = """
from dbos import _error  # a DBOS that moved its private cancellation errors elsewhere
del _error.DBOSWorkflowCancelledError, _error.DBOSAwaitedWorkflowCancelledError
import tether.durable._runner as runner
print("imported", runner.CANCELLED)
"""


def test_the_durable_runner_imports_without_dbos_private_errors() -> None:
    pytest.importorskip("dbos")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(NO_PRIVATE_DBOS)], capture_output=True, text=True,
                          timeout=HANG)
    assert proc.returncode == 0 and "imported ()" in proc.stdout, proc.stderr
