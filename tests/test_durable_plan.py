"""Plan mode in durable runs (issue 44, item 6): a PlanAgent's planner calls and tool calls are the
run's steps, so a worker SIGKILLed in the middle of the plan's loop, and again while the run waits
for a person's approval, is recovered by a fresh process that neither repeats an effect nor loses
the run; each iteration's effect has its own idempotency key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang import HANG

pytest.importorskip("dbos")

from tether.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "plan_agents.py"


def _spawn(db: str, ledger: Path, stall: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}", "TETHER_TEST_STALL": stall}
    return subprocess.Popen([sys.executable, str(WORKER), "--db", db, "--ledger", str(ledger)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate()


def _until(what: str, check, proc: subprocess.Popen[bytes], timeout: float = HANG):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (got := check()):
            return got
        if proc.poll() is not None:
            raise AssertionError(f"the worker exited waiting for {what}: {proc.communicate()[0].decode()}")
        time.sleep(0.1)
    raise AssertionError(f"never {what}")


def test_a_plan_killed_in_its_loop_and_while_parked_finishes_once(tmp_path: Path) -> None:
    db, ledger = str(tmp_path / "runs.db"), tmp_path / "ledger.txt"
    stalled = tmp_path / "stalled"
    first = _spawn(db, ledger, stall="plan1:2:0")  # the loop's second payment hangs: killed there
    try:
        _until("reached the second payment", stalled.exists, first)
    finally:
        _kill(first)
    assert ledger.read_text().splitlines() == ["pay alice 10 plan1:1:0"]

    store = RunStore(db)
    second = _spawn(db, ledger)  # recovers: the first payment is replayed from its step, not made again
    try:
        pending = _until("parked on the transfer", lambda: (row := store.run("plan1")) is not None
                         and row.status == "awaiting_approval" and row.pending, second)
    finally:
        _kill(second)  # killed while the run waits for a person
    assert pending["tool"] == "transfer" and pending["arguments"] == {"to": "savings", "amount": 100}
    approve = subprocess.run([sys.executable, "-m", "tether", "approve", "plan1", pending["call_id"], "--db", db],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True,
                             text=True, timeout=HANG)
    assert approve.returncode == 0, approve.stderr

    third = _spawn(db, ledger)
    out, _ = third.communicate(timeout=HANG)
    assert third.returncode == 0, out.decode()
    assert "completed: paid 3, transfer done" in out.decode()
    assert ledger.read_text().splitlines() == [
        "pay alice 10 plan1:1:0", "pay alice 10 plan1:2:0", "pay alice 10 plan1:3:0", "transfer savings 100 plan1:4:0"]
    attempts = (tmp_path / "ledger.txt.attempts").read_text().splitlines()
    # only the payment in flight at the kill was tried again (with its own key); nothing recorded ran twice
    assert sorted(attempts) == ["plan1:1:0", "plan1:2:0", "plan1:2:0", "plan1:3:0", "plan1:4:0"]
    row = store.run("plan1")
    assert row is not None and row.status == "completed"
    kinds = [e.kind for e in store.events("plan1")]
    assert "approval_decided" in kinds and kinds[-1] == "stop"
    store.close()
