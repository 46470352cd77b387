"""200 concurrent scripted runs through the task service: `python -m bench.service [--runs N]`.

For each store (SQLite WAL; PostgreSQL when TETHER_BENCH_POSTGRES or TETHER_TEST_POSTGRES names a
server): a real `tether serve` on 127.0.0.1 with 8 worker slots, N tasks submitted at once, each task's
SSE stream read by its own client, which confirms the one call that needs it. Each run makes three tool
calls, one confirmed call and a final answer streamed in five pieces. Reported: runs per second
(submit of the first to the last stop event), latency from a tool call finishing (the tool writes the
wall time to a ledger) to its `tool_call` SSE event reaching the client, p50/p99 (and p99 of the tool
calls that ended once every submission was accepted: the burst of N submissions and N stream openings
sets the tail before that); latency from the
model sending a text piece (the piece is its wall time) to its `text_delta` event reaching the client; the per-step checkpoint cost on the same store, measured as
bench/durable does (durable minus in-memory wall time per DBOS step, in this process); lost runs (not completed); duplicate side effects (an
idempotency key in the ledger twice).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
AGENTS = f"{Path(__file__).with_name('agents.py')}:AGENTS"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


RECONNECTS: list[str] = []  # what each reconnection was for, reported with the figures


async def post(client: httpx.AsyncClient, url: str, **kwargs) -> httpx.Response:
    """A POST retried when the connection broke (e.g. the server closed a kept-alive connection as it
    was reused: a race every HTTP client meets). Safe: the submit carries an Idempotency-Key and a
    repeated confirm is a 409."""
    for attempt in range(5):
        try:
            return await client.post(url, **kwargs)
        except httpx.TransportError as exc:
            RECONNECTS.append(f"POST {type(exc).__name__}")
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


async def one_task(client: httpx.AsyncClient, url: str, headers: dict, i: int, arrivals: dict,
                   text_ms: list[float]) -> tuple[str, bool]:
    r = await post(client, f"{url}/v1/tasks", json={"prompt": f"job {i}", "agent": "worker"},
                   headers={**headers, "Idempotency-Key": f"job-{i}"})
    r.raise_for_status()
    arrivals["submitted"] = max(arrivals.get("submitted", 0.0), time.time())
    task = r.json()["task_id"]
    last: str | None = None
    for _ in range(5):  # a broken stream is resumed after the last event seen, as an SSE client does
        try:
            async with client.stream("GET", f"{url}/v1/tasks/{task}/events",
                                     headers={**headers, **({"Last-Event-ID": last} if last else {})}) as resp:
                event: dict = {}
                async for line in resp.aiter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        key, _, value = line.partition(": ")
                        event[key] = value
                        continue
                    name, data, last = event.get("event"), json.loads(event.get("data", "{}")), event.get("id", last)
                    event = {}
                    if name == "text_delta":
                        now = time.time()
                        text_ms.extend((now - float(sent)) * 1000 for sent in data["text"].split())
                    elif name == "tool_call" and not data.get("is_error"):
                        arrivals[(task, data["call_id"])] = time.time()
                    elif name == "confirm_request":
                        await post(client, f"{url}/v1/tasks/{task}/confirm",
                                   json={"call_id": data["call_id"], "approved": True}, headers=headers)
                    elif name == "stop":
                        return task, data.get("stop_reason") == "completed"
        except httpx.TransportError as exc:
            RECONNECTS.append(f"GET events {type(exc).__name__}")
    return task, False


def run_store(name: str, db: str | None, runs: int, home: Path) -> dict:
    port, url = _port(), ""
    url = f"http://127.0.0.1:{port}"
    ledger = home / "ledger"
    env = {**os.environ, "TETHER_HOME": str(home), "TETHER_BENCH_LEDGER": str(ledger), "PYTHONPATH": str(ROOT / "src")}
    if db:
        env["TETHER_DB"] = db
    # one user per 10 tasks: the service's per-user limits (60 a minute, 20 in progress) are not the subject here
    keys = [subprocess.run([sys.executable, "-m", "tether.cli", "keys", "add", f"bench{u}"], env=env,
                           capture_output=True, text=True, check=True).stdout.strip() for u in range((runs + 9) // 10)]
    log = (home / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "serve", "--agents", AGENTS, "--port", str(port),
                             "--workers", "8"], env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise RuntimeError((home / "serve.log").read_text()) from None
                time.sleep(0.2)
        arrivals: dict = {}
        text_ms: list[float] = []

        async def main() -> list[tuple[str, bool]]:
            limits = httpx.Limits(max_connections=runs * 2 + 10, max_keepalive_connections=runs * 2 + 10)
            async with httpx.AsyncClient(timeout=600, limits=limits) as client:
                return await asyncio.gather(*(one_task(client, url, {"Authorization": f"Bearer {keys[i // 10]}"}, i,
                                                       arrivals, text_ms) for i in range(runs)))

        RECONNECTS.clear()
        started = time.time()
        try:
            done = asyncio.run(main())
        except Exception:
            print((home / "serve.log").read_text()[-5000:], file=sys.stderr)
            raise
        elapsed = time.time() - started
        lines = [ln.split() for ln in ledger.read_text().splitlines()] if ledger.exists() else []
        keys = [ln[1] for ln in lines]
        latencies, settled = [], []  # settled: tool calls that ended after the last submission was accepted
        for kind, key_, call_id, at in lines:
            got = arrivals.get((key_.split(":")[0], call_id))
            if kind == "step" and got is not None:
                latencies.append((got - float(at)) * 1000)
                if float(at) > arrivals["submitted"]:
                    settled.append(latencies[-1])
        return {
            "store": name, "runs": runs, "lost_runs": sum(1 for _, ok in done if not ok),
            "duplicate_side_effects": len(keys) - len(set(keys)), "side_effects": len(keys),
            "runs_per_second": round(runs / elapsed, 2), "seconds": round(elapsed, 1),
            "p50_event_latency_ms": round(_pct(latencies, 50), 1), "p99_event_latency_ms": round(_pct(latencies, 99), 1),
            "p99_event_latency_ms_after_submissions": round(_pct(settled, 99), 1),
            "seconds_to_accept_all_submissions": round(arrivals["submitted"] - started, 1),
            "reconnects": len(RECONNECTS), "reconnect_kinds": sorted(set(RECONNECTS)),
            "text_pieces": len(text_ms), "p50_text_latency_ms": round(_pct(text_ms, 50), 1),
            "p99_text_latency_ms": round(_pct(text_ms, 99), 1),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    out: dict = {"method": " ".join(__doc__.split()), "stores": {}}
    from bench.durable.__main__ import _postgres

    stores = [("sqlite", None)]
    pg = _postgres()
    if pg:
        stores.append(("postgres", pg))
    from bench.durable.__main__ import RUNS, TURNS, measure_durable, measure_memory

    memory = measure_memory()
    for name, db in stores:
        with tempfile.TemporaryDirectory() as home:
            out["stores"][name] = row = run_store(name, db, args.runs, Path(home))
            # the same checkpoint measure as bench/durable: durable minus in-memory wall time per DBOS step
            wall = measure_durable(db or str(Path(home) / "ckpt.db"))
            row["checkpoint_ms_per_step"] = round((wall - memory) * 1000 / (RUNS * (2 * TURNS + 1)), 3)
        print(f"{name:9} runs {row['runs']} lost {row['lost_runs']} dup {row['duplicate_side_effects']} "
              f"{row['runs_per_second']} runs/s  event p50 {row['p50_event_latency_ms']} ms p99 "
              f"{row['p99_event_latency_ms']} ms  text p50 {row['p50_text_latency_ms']} ms p99 "
              f"{row['p99_text_latency_ms']} ms  checkpoint {row['checkpoint_ms_per_step']} ms/step")
    Path(__file__).with_name("results.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
