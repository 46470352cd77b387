"""Approval-to-resume latency of a parked durable run: how long after a person's decision is sent
the run goes on (its approved tool body starts).

    python -m bench.durable.wake [--runs 20] [--no-stress]

Each of `--runs` runs (one at a time) reads an untrusted invoice, then asks to pay it and parks in
`DBOS.recv`; the bench then decides the call, alternating two ways a decision arrives: `client`
(`tether.durable._control.approve`, a DBOS client of its own: what `tether approve` and another
process do) and `in_process` (`_control.decide` through this process's DBOS: what the task service's
`POST /v1/tasks/{id}/confirm` does), plus that endpoint itself over HTTP (`http_confirm`: a
`tether serve` started for the bench, with this file's `AGENTS`). Latency = the pay tool's first
line - the moment the decision was handed over (for `client`, including opening the client).
Median and max per path, on SQLite and, when $TETHER_BENCH_POSTGRES or $TETHER_TEST_POSTGRES names
a server, on PostgreSQL; on the machine as found (`no_hog`: other work runs on it, its load is
recorded) and again beside `stress-ng --cpu 4` (when installed; `--no-stress` skips it). Written to
bench/durable/results.json under "approval_wake" (the rest of the file is left as it is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tether.tools._base import ToolContext

OUT = Path(__file__).with_name("results.json")
PATHS = ("client", "in_process")


def _agent(resumed: dict[str, float], durable: Any = None, *, clock: Any = time.perf_counter) -> Any:
    from tether import Agent, Limits, tool
    from tether._types import ModelReply, ModelRequest, ToolCall
    from tether.models._scripted import ScriptedModel
    from tether.policy import ApprovalBook, PendingApprover, SafetyPolicy
    @tool(untrusted_output=True)
    def read_invoice() -> str:
        """Read the invoice."""
        return "Invoice: 40 EUR to alice-iban."

    @tool(effect="irreversible")
    async def pay(to: str, amount: int, ctx: ToolContext) -> str:
        """Pay someone."""
        resumed.setdefault(str(ctx.idempotency_key).rsplit(":", 2)[0], clock())
        return f"paid {amount} to {to}"

    def script(request: ModelRequest) -> ModelReply:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done == 0:
            return ModelReply("", [ToolCall("call_0", "read_invoice", {})])
        if done == 1:
            return ModelReply("", [ToolCall("call_0", "pay", {"to": "alice-iban", "amount": 40})])
        return ModelReply("paid")

    policy = SafetyPolicy(approver=PendingApprover(ApprovalBook()))
    return Agent(ScriptedModel(script), tools=[read_invoice, pay], policy=policy, limits=Limits(max_steps=5),
                 user="alice", name="wake", durable=durable)


class _Ledger(dict[str, float]):
    """The service's runs write when their pay tool starts to a file (they run in its process)."""

    def setdefault(self, key: str, default: float) -> float:  # type: ignore[override]
        with open(os.environ["TETHER_BENCH_WAKE_LEDGER"], "a", encoding="utf-8") as fh:
            fh.write(f"{key}\t{default!r}\n")
        return default


def service_agent(user: str | None) -> Any:
    """The task service's agent (`tether serve --agents bench/durable/wake.py:AGENTS`)."""
    return _agent(_Ledger(), clock=time.time)


AGENTS = {"wake": service_agent}


async def _parked(store: Any, run_id: str, task: asyncio.Task[Any]) -> dict[str, Any]:
    end = time.monotonic() + 300
    while time.monotonic() < end:
        row = store.run(run_id)
        if row is not None and row.status == "awaiting_approval" and row.pending:
            return dict(row.pending)
        if task.done():
            raise RuntimeError(f"run {run_id} ended without parking: {task.result()}")
        await asyncio.sleep(0.005)
    raise RuntimeError(f"run {run_id} never parked")


async def _measure(database: str, runs: int) -> dict[str, list[float]]:
    from dbos import DBOS

    from tether.durable import runtime, teardown
    from tether.durable._control import approve, decide

    resumed: dict[str, float] = {}
    agent = _agent(resumed, database)
    store = runtime().store
    latencies: dict[str, list[float]] = {p: [] for p in PATHS}
    try:
        for i in range(runs):
            run_id = f"wake{i}"
            task = asyncio.create_task(agent.arun("pay the invoice", run_id=run_id))
            pending = await _parked(store, run_id, task)
            path = PATHS[i % len(PATHS)]
            sent = time.perf_counter()
            if path == "client":
                await asyncio.to_thread(approve, database, run_id, pending["call_id"], by="bench")
            else:
                await asyncio.to_thread(decide, store, DBOS, run_id, pending["call_id"], by="bench")
            result = await asyncio.wait_for(task, 600)
            assert result.completed and run_id in resumed, (result.stop_reason, result.error)
            latencies[path].append((resumed[run_id] - sent) * 1000)
    finally:
        teardown()
    return latencies


def _summary(latencies: dict[str, list[float]]) -> dict[str, Any]:
    return {path: {"median_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1), "runs": len(ms)}
            for path, ms in latencies.items() if ms}


def _one(database: str, runs: int) -> dict[str, Any]:
    """One store's figures, measured in a fresh process (DBOS is launched once per process)."""
    out = subprocess.run([sys.executable, "-m", "bench.durable.wake", "--child", database, "--runs", str(runs)],
                         cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _http(tmp: Path, database: str, runs: int) -> dict[str, Any]:
    """`POST /v1/tasks/{id}/confirm` of a `tether serve` over `database` (its tasks run in its process)."""
    import httpx

    home = Path(tempfile.mkdtemp(dir=tmp))
    ledger = home / "ledger"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TETHER_HOME": str(home), "TETHER_DB": database, "TETHER_BENCH_WAKE_LEDGER": str(ledger),
           "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
    cli = [sys.executable, "-m", "tether.cli"]
    key = subprocess.run([*cli, "keys", "add", "bench"], env=env, capture_output=True, text=True, check=True)
    headers = {"Authorization": f"Bearer {key.stdout.strip()}"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*cli, "serve", "--agents", f"{Path(__file__).resolve()}:AGENTS", "--port", str(port),
                               "--workers", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
            _until(lambda: _healthy(http))
            latencies = [_confirmed(http, ledger) for _ in range(runs)]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    return _summary({"http_confirm": latencies})["http_confirm"]


def _confirmed(http: Any, ledger: Path) -> float:
    """One task to its approval, confirmed: ms from the confirm request to its pay tool's start."""
    made = http.post("/v1/tasks", json={"prompt": "pay the invoice", "agent": "wake"})
    assert made.status_code == 201, made.text
    task = made.json()["task_id"]
    body = _until(lambda: _status(http, task, "awaiting_approval"))
    sent = time.time()
    r = http.post(f"/v1/tasks/{task}/confirm", json={"call_id": body["pending_approvals"][0]["call_id"], "approved": True})
    assert r.status_code == 200, r.text
    line = _until(lambda: next((ln for ln in _lines(ledger) if ln.startswith(task + "\t")), None))
    _until(lambda: _status(http, task, "completed"))
    return (float(line.split("\t")[1]) - sent) * 1000


def _until(check: Any, timeout: float = 300) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (found := check()) is not None and found is not False:
            return found
        time.sleep(0.002)
    raise RuntimeError("the service never got there")


def _healthy(http: Any) -> bool:
    import httpx

    try:
        return bool(http.get("/healthz").status_code == 200)
    except httpx.HTTPError:
        return False


def _status(http: Any, task: str, status: str) -> dict[str, Any] | None:
    body = http.get(f"/v1/tasks/{task}").json()
    return body if body["status"] == status else None


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _stores(tmp: Path, runs: int, label: str) -> dict[str, Any]:
    from bench.durable.__main__ import _postgres

    figures: dict[str, Any] = {"load_average_1min_before": round(os.getloadavg()[0], 2)}
    figures["sqlite_wal"] = _one(str(tmp / f"wake-{label}.db"), runs)
    figures["sqlite_wal"].update(http_confirm=_http(tmp, str(tmp / f"wake-{label}-http.db"), runs))
    if (pg := _postgres()) is not None:
        figures["postgres"] = _one(pg, runs)
        figures["postgres"].update(http_confirm=_http(tmp, str(_postgres()), runs))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.durable.wake")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-stress", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # measure one database in this process
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_summary(asyncio.run(_measure(args.child, args.runs)))))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.durable.__main__ import drop_postgres_databases

    tmp = Path(tempfile.mkdtemp(prefix="tether-bench-wake-"))
    results: dict[str, Any] = {"runs": args.runs, "no_hog": _stores(tmp, args.runs, "no_hog")}
    if not args.no_stress and shutil.which("stress-ng"):
        hog = subprocess.Popen(["stress-ng", "--cpu", "4", "--quiet"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(2)  # the hogs up to speed
            results["stress_ng_cpu_4"] = _stores(tmp, args.runs, "stress")
        finally:
            os.killpg(hog.pid, signal.SIGTERM)
            hog.wait()
    drop_postgres_databases()
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))
    saved = json.loads(OUT.read_text()) if OUT.exists() else {}
    saved["approval_wake"] = results
    OUT.write_text(json.dumps(saved, indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
