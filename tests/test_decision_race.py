"""Issue 24, item 11: approve and deny racing on one parked call: exactly one wins (one conditional
write), the other gets one clear error, and only the winner's decision is sent to the run."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from hang import HANG

from tether.durable._control import ControlError, decide
from tether.store._sql import RunStore


class Inbox:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.lock = threading.Lock()

    def send(self, destination_id: str, message: Any, topic: str | None = None) -> None:
        with self.lock:
            self.sent.append(message)

    def cancel_workflow(self, workflow_id: str) -> None:  # pragma: no cover
        raise AssertionError("not used")

    def list_workflows(self, *, status: list[str] | None = None,
                       workflow_id_prefix: str | None = None) -> list[Any]:  # pragma: no cover
        raise AssertionError("not used")


class BothRead(RunStore):
    """A store whose readers both see the run before either writes: the race made certain."""

    gate = threading.Barrier(2, timeout=10)

    def run(self, run_id: str) -> Any:
        row = super().run(run_id)
        with contextlib.suppress(threading.BrokenBarrierError):
            self.gate.wait()
        return row


@pytest.mark.parametrize("round_", range(10))
def test_approve_and_deny_at_once_exactly_one_wins(tmp_path: Path, round_: int) -> None:
    BothRead.gate = threading.Barrier(2, timeout=10)
    store = BothRead(str(tmp_path / "runs.db"))
    store.create_run("r", "agent", "alice", "pay the invoice")
    store.set_status("r", "awaiting_approval", pending={"call_id": "call_0", "step": 2, "tool": "pay"})
    inbox = Inbox()
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def answer(approved: bool) -> None:
        start.wait()
        try:
            decide(store, inbox, "r", "call_0", approved=approved, by="alice" if approved else "bob")
            outcomes.append("approved" if approved else "denied")
        except ControlError as exc:
            outcomes.append(f"error: {exc}")

    threads = [threading.Thread(target=answer, args=(flag,)) for flag in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    winners = [o for o in outcomes if not o.startswith("error")]
    assert len(winners) == 1, outcomes
    assert len(inbox.sent) == 1 and inbox.sent[0]["approved"] == (winners[0] == "approved")
    assert any("already decided" in o for o in outcomes), outcomes
    store.close()
