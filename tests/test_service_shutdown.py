"""Graceful shutdown of the task service, over real processes: on SIGTERM a worker (`tether worker`, or
`tether serve` with worker slots) takes no new task, lets the step in flight finish (and starts no
other), lets go of a run parked on an approval at once, and exits 0, leaving its runs pending; started
again with the same executor id it finishes them. Every side effect happens once; the event stream has
no gap and no duplicate. When the grace period ends first, the step is interrupted and runs again on
recovery with the same idempotency key.

Timing margins are wide (a loaded 2-core machine); the tests poll for conditions, never sleep fixed times."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hang import HANG
from store_fixtures import fresh_postgres_database
from test_service import ROOT, Service, events, submit, wait_status

httpx = pytest.importorskip("httpx")

AGENTS = f"{ROOT / 'tests' / 'service_agents.py'}:SHUTDOWN_AGENTS"
LONG = int(2 * HANG)  # a grace period, or a tool call, that outlasts every wait: ending before it proves it was not waited for
FULL_RUN = ["status", "model_call", "tool_call", "tool_call", "model_call", "tool_call", "text_delta", "model_call",
            "answer", "stop"]


def poll(what: str, check, timeout: float = HANG):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Worker:
    """A `tether worker` process, its stderr in a file."""

    def __init__(self, svc: Service, executor_id: str, grace: int) -> None:
        self.log = svc.home / f"worker-{executor_id}-{time.monotonic_ns()}.log"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tether.cli", "worker", "--agents", AGENTS, "--concurrency", "2",
                 "--grace", str(grace)], env={**svc.env, "TETHER_EXECUTOR_ID": executor_id},
                stdout=subprocess.DEVNULL, stderr=err, text=True)
        poll("the worker to start", lambda: "running up to" in self.text() or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.text()

    def text(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def api_key(svc: Service, user: str) -> dict[str, str]:
    """Service.key without a process start (a `tether keys add` costs ~1.5 s of CPU)."""
    from tether.server._keys import ServiceTables
    from tether.store._sql import engine_url, make_engine

    engine = make_engine(engine_url(svc.env["TETHER_DB"]))
    try:
        return {"Authorization": f"Bearer {ServiceTables(engine).add_key(user)}"}
    finally:
        engine.dispose()


def serve(tmp_path: Path, grace: int) -> Service:
    svc = Service(tmp_path)
    svc.env["TETHER_DB"] = str(tmp_path / "service.db")
    svc.start(AGENTS, "--grace", str(grace))
    return svc


def listening(svc: Service) -> bool:
    try:
        return httpx.get(svc.url + "/healthz", timeout=5).status_code == 200  # one try: poll() asks again
    except httpx.HTTPError:
        return False


def dbos_status(db: str, task_id: str) -> str:
    from dbos import DBOSClient

    from tether.store._sql import engine_url

    client = DBOSClient(system_database_url=engine_url(db).replace("postgresql+psycopg://", "postgresql://"))
    try:
        return client.retrieve_workflow(task_id).get_status().status
    finally:
        client.destroy()


def send(proc: subprocess.Popen, sig: int, timeout: float) -> int:
    """Signal `proc`; its exit code."""
    proc.send_signal(sig)
    return proc.wait(timeout=timeout)


class Stream:
    """Reads a task's SSE stream in the background (`ended` once the server closes it)."""

    def __init__(self, svc: Service, headers: dict, task_id: str, last: str | None = None) -> None:
        self.got: list[dict] = []
        self.ended = threading.Event()

        def read() -> None:
            try:
                events(svc, headers, task_id, last, into=self.got)
            except httpx.HTTPError:  # the server went away mid-read
                pass
            finally:
                self.ended.set()

        threading.Thread(target=read, daemon=True).start()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "service.db")
    else:
        yield from fresh_postgres_database()


@pytest.fixture
def api(database: str, tmp_path: Path) -> Iterator[Service]:
    """An API-only server (no worker slots) over `database`; the workers are the tests' own."""
    svc = Service(tmp_path)
    svc.env["TETHER_DB"] = database
    svc.start(AGENTS, "--workers", "0")
    try:
        yield svc
    finally:
        svc.stop()


def test_sigterm_drains_at_a_step_boundary_and_a_restart_finishes(api: Service, database: str) -> None:
    """`tether worker`: the tool call in flight finishes, no other step and no new task starts, the
    runs stay pending; the same executor id started again finishes them, each side effect once."""
    alice = api_key(api, "alice")
    worker = Worker(api, "w1", grace=LONG)
    try:
        task = submit(api, alice, "steps", prompt="-1")  # the first call runs until released below
        live = Stream(api, alice, task)
        # run_id:step:index: the first turn's two calls (run one at a time), the second's
        first, other, last = f"{task}:1:0", f"{task}:1:1", f"{task}:2:0"
        poll("the first tool call to start", lambda: f"start {first}" in api.ledger())
        worker.proc.send_signal(signal.SIGTERM)
        poll("the worker to drain", lambda: "draining" in worker.text())
        late = submit(api, alice, "steps", prompt="0.2")  # while the first call still runs
        (api.home / "ledger.release").touch()  # now the first call ends
        code = worker.proc.wait(timeout=HANG)  # the step's end, not the grace period's (LONG)
        assert code == 0, worker.text()
        # the call in flight finished, once; nothing after it started (not even its turn's other call, whose
        # step id was reserved with it), nor the late task
        assert api.ledger() == [f"start {first}", f"done {first}"]
        assert "1 runs left pending" in worker.text(), worker.text()
        body = httpx.get(f"{api.url}/v1/tasks/{task}", headers=alice, timeout=HANG).json()
        assert body["status"] == "running" and body["stop_reason"] is None and body["error"] is None, body
        assert dbos_status(database, task) == "PENDING"
        assert httpx.get(f"{api.url}/v1/tasks/{late}", headers=alice, timeout=HANG).json()["status"] == "pending"
        assert dbos_status(database, late) == "ENQUEUED"
        assert not live.ended.is_set(), [e["event"] for e in live.got]  # no stop written for a drained run

        # the same executor id again: the run continues from its checkpoint, the first call is not repeated
        worker = Worker(api, "w1", grace=LONG)
        for t in (task, late):
            body = wait_status(api, alice, t, "completed", "error", "stopped", "cancelled")
            assert body["status"] == "completed" and body["answer"] == "finished", body
        mine = [line for line in api.ledger() if task in line]
        assert mine == [f"start {first}", f"done {first}", f"start {other}", f"done {other}", f"start {last}",
                        f"done {last}"]
        assert [line for line in api.ledger() if late in line and line.startswith("done")] == \
            [f"done {late}:1:0", f"done {late}:1:1", f"done {late}:2:0"]
        assert live.ended.wait(HANG)
        full = events(api, alice, task)
        assert [e["event"] for e in full if not e["event"].endswith("_started")] == FULL_RUN
        assert live.got == full  # the live stream, across the worker's restart: no gap, no duplicate
        seqs = [int(e["id"].split(".")[0]) for e in full]
        assert sorted(set(seqs)) == list(range(max(seqs) + 1))
    finally:
        worker.kill()


def test_sigterm_lets_go_of_a_parked_run_at_once(tmp_path: Path) -> None:
    """`tether serve --workers N`: a run parked on an approval does not hold the shutdown; the event
    stream ends with the server and resumes after the restart; the confirmed call runs once."""
    svc = serve(tmp_path, grace=LONG)
    try:
        alice = api_key(svc, "carol")
        task = submit(svc, alice, "billing")
        wait_status(svc, alice, task, "awaiting_approval")
        live = Stream(svc, alice, task)
        poll("the stream to catch up", lambda: len(live.got) >= 5)
        assert send(svc.proc, signal.SIGTERM, timeout=HANG) == 0  # not the grace period (LONG): nothing was in flight
        assert live.ended.wait(HANG)
        head = live.got
        assert [e["event"] for e in head][-2:] == ["confirm_request", "status"]
        svc.start(AGENTS, "--grace", str(LONG))
        wait_status(svc, alice, task, "awaiting_approval")
        r = httpx.post(f"{svc.url}/v1/tasks/{task}/confirm", json={"call_id": "c1", "approved": True}, headers=alice, timeout=HANG)
        assert r.status_code == 200, r.text
        assert wait_status(svc, alice, task, "completed")["answer"] == "Done: charged 99"
        assert svc.ledger() == ["charge 99"]
        tail = events(svc, alice, task, last=head[-1]["id"])
        assert head + tail == events(svc, alice, task)
    finally:
        svc.stop()


def test_a_step_cut_short_runs_again_on_recovery(tmp_path: Path) -> None:
    """A second signal during the drain exits at once; the grace period's end interrupts the step in
    flight. Either way the run stays pending and the step runs again on recovery, with the same
    idempotency key (the tool, idempotent, acts once)."""
    svc = serve(tmp_path, grace=LONG)
    try:
        alice = api_key(svc, "dora")
        task = submit(svc, alice, "steps", prompt=f"{LONG} 0.2 {LONG}")  # first tries of the 1st and 3rd call: LONG
        first, other, last = f"{task}:1:0", f"{task}:1:1", f"{task}:2:0"
        poll("the first tool call to start", lambda: f"start {first}" in svc.ledger())
        svc.proc.send_signal(signal.SIGTERM)
        poll("the listener to close (the drain has begun)", lambda: not listening(svc))
        assert send(svc.proc, signal.SIGINT, timeout=HANG) == 1  # at once, not after the grace period (LONG)
        assert svc.ledger() == [f"start {first}"]

        svc.start(AGENTS, "--grace", "1")  # recovered: the first call again (quick now), the others
        poll("the last tool call to start", lambda: f"start {last}" in svc.ledger())
        assert send(svc.proc, signal.SIGTERM, timeout=HANG) == 0  # the 1 s grace period, not the tool's LONG
        assert "1 steps cut short by the grace period" in svc.proc.stderr.read()
        ran = [f"start {first}", f"start {first}", f"done {first}", f"start {other}", f"done {other}"]
        assert svc.ledger() == [*ran, f"start {last}"]

        svc.start(AGENTS, "--grace", "1")
        body = wait_status(svc, alice, task, "completed", "error", "stopped", "cancelled")
        assert body["status"] == "completed", body
        assert svc.ledger() == [*ran, f"start {last}", f"start {last}", f"done {last}"]
        assert [e["event"] for e in events(svc, alice, task) if not e["event"].endswith("_started")] == FULL_RUN
    finally:
        svc.stop()
