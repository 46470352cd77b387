"""200 concurrent scripted runs through the task service: `python -m bench.service [--runs N]`.

For each store (SQLite WAL; PostgreSQL when TETHER_BENCH_POSTGRES or TETHER_TEST_POSTGRES names a
server), in two layouts (`--layouts`): a real `tether serve` on 127.0.0.1 with 8 worker slots
("single"), and `tether serve --workers 0` with one `tether worker --concurrency 8` ("split",
`stores_split` in results.json). N tasks submitted at once, each task's
SSE stream read by its own client, which confirms the one call that needs it. Each run makes three tool
calls, one confirmed call and a final answer streamed in five pieces. Reported: runs per second
(submit of the first to the last stop event), latency from a tool call finishing (the tool writes the
wall time to a ledger) to its `tool_call` SSE event reaching the client, p50/p99 (and p99 of the tool
calls that ended once every submission was accepted: the burst of N submissions and N stream openings
sets the tail before that); latency from the
model sending a text piece (the piece is its wall time) to its `text_delta` event reaching the client; the per-step checkpoint cost on the same store, measured as
bench/durable does (durable minus in-memory wall time per DBOS step, in this process, once per store right after its first
layout's run: it does not depend on the layout); lost runs (not completed); duplicate side effects (an
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
            RECONNECTS.append(f"POST {type(exc).__name__}: {str(exc)[:80]}")
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


async def one_task(client: httpx.AsyncClient, url: str, headers: dict, i: int, arrivals: dict,
                   text_ms: list[float]) -> tuple[str, bool]:
    r = await post(client, f"{url}/v1/tasks", json={"prompt": f"job {i}", "agent": "worker"},
                   headers={**headers, "Idempotency-Key": f"job-{i}"})
    r.raise_for_status()
    arrivals["last_submission_at"] = max(arrivals.get("last_submission_at", 0.0), time.time())
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
            RECONNECTS.append(f"GET events {type(exc).__name__}: {str(exc)[:80]} ({'after ' + last if last else 'before the first event'})")
    return task, False


def run_store(name: str, db: str | None, runs: int, home: Path, layout: str = "single") -> dict:
    """One store, one layout: "single" (`tether serve --workers 8`) or "split" (`tether serve --workers 0`
    for the API and one `tether worker --concurrency 8` process, as docs/service.md advises)."""
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
                             "--workers", "8" if layout == "single" else "0"], env=env, stdout=subprocess.DEVNULL,
                            stderr=log, text=True)
    worker = None
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise RuntimeError((home / "serve.log").read_text()) from None
                time.sleep(0.2)
        if layout == "split":  # after the API: it made the tables
            worker = subprocess.Popen([sys.executable, "-m", "tether.cli", "worker", "--agents", AGENTS,
                                       "--concurrency", "8"], env={**env, "TETHER_EXECUTOR_ID": "bench-worker"},
                                      stdout=subprocess.DEVNULL, stderr=log, text=True)
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
                if float(at) > arrivals["last_submission_at"]:
                    settled.append(latencies[-1])
        return {
            "store": name, "layout": layout, "runs": runs, "lost_runs": sum(1 for _, ok in done if not ok),
            "duplicate_side_effects": len(keys) - len(set(keys)), "side_effects": len(keys),
            "runs_per_second": round(runs / elapsed, 2), "seconds": round(elapsed, 1),
            "p50_event_latency_ms": round(_pct(latencies, 50), 1), "p99_event_latency_ms": round(_pct(latencies, 99), 1),
            "p99_event_latency_ms_after_submissions": round(_pct(settled, 99), 1),
            "seconds_to_accept_all_submissions": round(arrivals["last_submission_at"] - started, 1),
            "reconnects": len(RECONNECTS), "reconnect_kinds": sorted(set(RECONNECTS)),
            "text_pieces": len(text_ms), "p50_text_latency_ms": round(_pct(text_ms, 50), 1),
            "p99_text_latency_ms": round(_pct(text_ms, 99), 1),
        }
    finally:
        for p in (worker, proc):
            if p is not None:
                p.send_signal(signal.SIGTERM)
        for p in (worker, proc):
            if p is not None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--layouts", default="single,split", help="single (API and workers in one process), "
                        "split (an API process and a worker process), or both, comma-separated")
    args = parser.parse_args()
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts or set(layouts) - {"single", "split"}:
        parser.error("--layouts takes single, split or single,split")
    out: dict = {"method": " ".join(__doc__.split()), "stores": {}}
    from bench.durable.__main__ import _postgres, drop_postgres_databases

    stores = [("sqlite", None)]
    pg = _postgres()
    if pg:
        stores.append(("postgres", pg))
    from bench.durable.__main__ import RUNS, TURNS, measure_durable, measure_memory

    memory = measure_memory()
    checkpoint: dict[str, float] = {}  # per store: measured in this process, so the same for every layout
    for layout in layouts:
        for name, db in stores:
            if db is not None and layout != layouts[0]:
                db = _postgres()  # a fresh database for each layout
            with tempfile.TemporaryDirectory() as home:
                row = run_store(name, db, args.runs, Path(home), layout)
                (out["stores"] if layout == "single" else out.setdefault("stores_split", {}))[name] = row
                if name not in checkpoint:
                    # the same checkpoint measure as bench/durable (durable minus in-memory wall time per DBOS
                    # step), on a fresh database as there, not on the one the 200 runs just filled
                    wall = measure_durable(_postgres() if db else str(Path(home) / "ckpt.db"))
                    checkpoint[name] = round((wall - memory) * 1000 / (RUNS * (2 * TURNS + 1)), 3)
                row["checkpoint_ms_per_step"] = checkpoint[name]
            _report(row)
    Path(__file__).with_name("results.json").write_text(json.dumps(out, indent=1) + "\n")
    drop_postgres_databases()


def _report(row: dict) -> None:
    print(f"{row['store'] + '/' + row['layout']:16} runs {row['runs']} lost {row['lost_runs']} dup "
          f"{row['duplicate_side_effects']} {row['runs_per_second']} runs/s  event p50 {row['p50_event_latency_ms']} "
          f"ms p99 {row['p99_event_latency_ms']} ms (after submissions {row['p99_event_latency_ms_after_submissions']}"
          f" ms)  text p50 {row['p50_text_latency_ms']} ms p99 {row['p99_text_latency_ms']} ms  checkpoint "
          f"{row['checkpoint_ms_per_step']} ms/step")

if __name__ == "__main__":
    main()
