"""The task service over real HTTP: `tether serve` (uvicorn on 127.0.0.1) with a SQLite run database,
driven by httpx: submit, stream, confirm, deny, cancel, resume the stream across a restart, users
isolated, idempotent submission, bad requests answered with JSON."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hang import HANG

httpx = pytest.importorskip("httpx")
pytest.importorskip("dbos")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

ROOT = Path(__file__).resolve().parents[1]
AGENTS = f"{ROOT / 'tests' / 'service_agents.py'}:AGENTS"
# Waits for the server end on an event (it answers, a task reaches a status); this bound only catches a
# hang. A busy machine (stress-ng beside the suite, load 50 on 2 cores) took over 60 s to start one.


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "TETHER_HOME": str(home), "TETHER_TEST_LEDGER": str(home / "ledger"),
                    "PYTHONPATH": str(ROOT / "src")}
        self.proc: subprocess.Popen | None = None

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tether.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=HANG)

    def start(self, agents: str = AGENTS, *extra: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "serve", "--agents", agents, "--port",
                                      str(self.port), "--workers", "4", *extra], env=self.env, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=HANG).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"tether serve exited: {self.proc.stderr.read()}")
            time.sleep(0.2)
        self.stop(signal.SIGKILL)  # not left running after the test
        raise RuntimeError(f"tether serve did not answer /healthz within {HANG:g} s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def key(self, user: str) -> dict[str, str]:
        done = self.cli("keys", "add", user)
        assert done.returncode == 0, done.stderr
        return {"Authorization": f"Bearer {done.stdout.strip()}"}

    def ledger(self) -> list[str]:
        path = self.home / "ledger"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One server for the module (each test makes its own users); the restart test has its own."""
    svc = Service(tmp_path_factory.mktemp("svc"))
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def submit(svc: Service, headers: dict, agent: str, prompt: str = "go", **extra) -> str:
    r = httpx.post(svc.url + "/v1/tasks", json={"prompt": prompt, "agent": agent, **extra}, headers=headers, timeout=HANG)
    assert r.status_code == 201, r.text
    return r.json()["task_id"]


def wait_status(svc: Service, headers: dict, task_id: str, *statuses: str, timeout: float = HANG) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(f"{svc.url}/v1/tasks/{task_id}", headers=headers, timeout=HANG).json()
        if body["status"] in statuses:
            return body
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} stayed {body['status']}, expected {statuses}")


def events(svc: Service, headers: dict, task_id: str, last: str | None = None, limit: int | None = None,
           into: list[dict] | None = None, url: str | None = None) -> list[dict]:
    """SSE events until the stream ends (or `limit` events), appended to `into` as they come if given;
    `url`: the stream's path with its query (a stream token's `events_url`)."""
    out: list[dict] = [] if into is None else into
    h = dict(headers, **({"Last-Event-ID": last} if last else {}))
    with httpx.stream("GET", svc.url + (url or f"/v1/tasks/{task_id}/events"), headers=h, timeout=HANG) as r:
        assert r.status_code == 200
        current: dict = {}
        for line in r.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if current:
                    out.append(current)
                    current = {}
                    if limit is not None and len(out) >= limit:
                        break
                continue
            field, _, value = line.partition(": ")
            current[field] = json.loads(value) if field == "data" else value
    return out


def test_submit_stream_get_list(service: Service) -> None:
    alice = service.key("alice")
    task = submit(service, alice, "calc")
    evs = events(service, alice, task)
    names = [e["event"] for e in evs]
    assert names == ["status", "run_started", "model_call_started", "model_call", "tool_call_started", "tool_call",
                     "model_call_started", "text_delta", "model_call", "answer", "stop"]
    assert evs[-2]["data"]["answer"] == evs[7]["data"]["text"] == "The sum is 5."
    assert evs[4]["data"]["name"] == evs[5]["data"]["name"] == "add"  # the call opens, then ends
    # the timeline from the stream alone: every SSE event named by a kind parses as its typed event
    from tether.events import (
        EVENT_TYPES,
        ModelCallEnded,
        ModelCallStarted,
        ToolCallEnded,
        ToolCallStarted,
        typed,
    )
    from tether.events import TraceEvent as Envelope

    timeline = [typed(Envelope(e["event"], 0, 0.0, 0.0, e["data"])) for e in evs if e["event"] in EVENT_TYPES]
    opened = [(type(e).__name__, e.call_id) for e in timeline if isinstance(e, ToolCallStarted)]
    closed = [(type(e).__name__, e.call_id, e.decision) for e in timeline if isinstance(e, ToolCallEnded)]
    assert opened == [("ToolCallStarted", "c1")] and closed == [("ToolCallEnded", "c1", "allowed")]
    assert sum(isinstance(e, ModelCallStarted) for e in timeline) == sum(isinstance(e, ModelCallEnded) for e in timeline) == 2
    ids = [e["id"] for e in evs]
    assert len(set(ids)) == len(ids)
    body = httpx.get(f"{service.url}/v1/tasks/{task}", headers=alice, timeout=HANG).json()
    assert body["status"] == "completed" and body["answer"] == "The sum is 5." and body["findings"]
    listed = httpx.get(f"{service.url}/v1/tasks", params={"status": "completed"}, headers=alice, timeout=HANG).json()
    assert [t["task_id"] for t in listed["tasks"]] == [task]


def test_text_streams_live_and_resumes_mid_text(service: Service) -> None:
    from service_agents import ANSWER

    alice = service.key("tess")
    task = submit(service, alice, "chatty")
    first = events(service, alice, task, limit=6)  # "status", then text as the model writes it
    assert [e["event"] for e in first[:4]] == ["status", "run_started", "model_call_started", "text_delta"]
    full = events(service, alice, task)
    names = [e["event"] for e in full]
    assert names[:4] == ["status", "run_started", "model_call_started", "text_delta"]
    assert names[-2:] == ["answer", "stop"]
    text_before = [e["data"]["text"] for e in full[:names.index("model_call")] if e["event"] == "text_delta"]
    assert "".join(text_before) == "Let me add them."
    last_call = len(names) - 1 - names[::-1].index("model_call")
    tool = names.index("tool_call")
    final = "".join(e["data"]["text"] for e in full[tool:last_call] if e["event"] == "text_delta")
    assert final == ANSWER == full[-2]["data"]["answer"]
    assert full[:6] == first
    middle = full[tool + 4]["id"]  # in the middle of the final answer's text
    assert full[tool + 1]["event"] == "model_call_started" and full[tool + 4]["event"] == "text_delta"
    assert events(service, alice, task, last=middle) == full[tool + 5:]


def test_users_are_isolated_and_keys_required(service: Service) -> None:
    alice, bob = service.key("alice2"), service.key("bob2")
    task = submit(service, alice, "calc")
    for method, path in [("GET", ""), ("GET", "/events"), ("POST", "/cancel")]:
        r = httpx.request(method, f"{service.url}/v1/tasks/{task}{path}", headers=bob, timeout=HANG)
        assert r.status_code == 404 and r.json() == {"error": f"no task {task}"}
    assert httpx.get(f"{service.url}/v1/tasks", headers=bob, timeout=HANG).json()["tasks"] == []
    r = httpx.get(f"{service.url}/v1/tasks", timeout=HANG)
    assert r.status_code == 401 and "API key" in r.json()["error"]
    r = httpx.get(f"{service.url}/v1/tasks", headers={"Authorization": "Bearer nope"}, timeout=HANG)
    assert r.status_code == 401


def test_bad_requests_get_json_4xx(service: Service) -> None:
    alice = service.key("carol")
    cases = [
        ({"agent": "calc"}, 422, "prompt: Field required"),
        ({"prompt": "", "agent": "calc"}, 422, "prompt"),
        ({"prompt": "x", "agent": "nope"}, 422, "agent: Input should be 'billing', 'billing_twice', 'booking', 'calc', 'chatty', 'invoice', 'slow' or 'team'"),
        ({"prompt": "x", "agent": "calc", "limits": {"max_stepz": 3}}, 422, "limits.max_stepz: Extra inputs"),
        ({"prompt": "x", "agent": "calc", "limits": {"max_steps": -1}}, 422, "limits.max_steps: Input should be greater than 0"),
        ({"prompt": "x" * 100_001, "agent": "calc"}, 413, "characters"),
    ]
    for body, status, needle in cases:
        r = httpx.post(service.url + "/v1/tasks", json=body, headers=alice, timeout=HANG)
        assert r.status_code == status, (body, r.text)
        assert needle in r.json()["error"], r.json()
    r = httpx.post(service.url + "/v1/tasks", content=b"x" * 1_000_001, headers=alice, timeout=HANG)
    assert r.status_code == 413 and "bytes" in r.json()["error"]

    def chunked():  # no Content-Length: the limit counts the bytes as they stream in
        yield b'{"agent": "calc", "prompt": "'
        for _ in range(30):
            yield b"x" * 100_000
        yield b'"}'

    r = httpx.post(service.url + "/v1/tasks", content=chunked(), headers={**alice, "content-type": "application/json"},
                   timeout=HANG)
    assert r.status_code == 413 and r.json()["error"] == "request body over 1000000 bytes", r.text
    r = httpx.post(service.url + "/v1/tasks", content=b"{not json", headers={**alice, "content-type": "application/json"}, timeout=HANG)
    assert r.status_code == 422 and "error" in r.json()
    assert httpx.get(f"{service.url}/v1/tasks", headers=alice, timeout=HANG).json()["tasks"] == []  # nothing half-created


def test_keys_are_listed_without_their_secret_and_revoked_at_once(service: Service) -> None:
    done = service.cli("keys", "add", "erin", "--label", "erin's laptop")
    key = done.stdout.strip()
    other = service.key("erin")["Authorization"].removeprefix("Bearer ")
    assert httpx.get(f"{service.url}/v1/tasks", headers={"Authorization": f"Bearer {key}"}, timeout=HANG).status_code == 200
    listed = service.cli("keys", "list", "--user", "erin")
    assert listed.returncode == 0 and "tk_" not in listed.stdout, listed
    lines = listed.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith("erin's laptop") and all(" erin " in line for line in lines)
    key_id = lines[0].split()[0]
    revoked = service.cli("keys", "revoke", key_id)
    assert revoked.returncode == 0 and f"revoked key {key_id} of erin" in revoked.stderr, revoked
    r = httpx.get(f"{service.url}/v1/tasks", headers={"Authorization": f"Bearer {key}"}, timeout=HANG)
    assert r.status_code == 401 and "API key" in r.json()["error"]  # the next request already
    assert httpx.get(f"{service.url}/v1/tasks", headers={"Authorization": f"Bearer {other}"}, timeout=HANG).status_code == 200
    again = service.cli("keys", "revoke", key_id)
    assert again.returncode == 1 and again.stderr.startswith("tether: no key with id"), again
    assert service.cli("keys", "revoke", other).returncode == 0  # by the key itself
    assert httpx.get(f"{service.url}/v1/tasks", headers={"Authorization": f"Bearer {other}"}, timeout=HANG).status_code == 401
    assert service.cli("keys", "list", "--user", "erin").stdout == ""
    bad = service.cli("keys", "revoke", "nope")
    assert bad.returncode == 1 and "neither a key" in bad.stderr and "Traceback" not in bad.stderr


def test_a_stream_token_opens_one_tasks_events_without_the_key(service: Service) -> None:
    """What a web page's EventSource does: no Authorization header, the token in the URL."""
    done = service.cli("keys", "add", "frank")
    frank = {"Authorization": f"Bearer {done.stdout.strip()}"}
    grace = service.key("grace")
    task, other = submit(service, frank, "calc"), submit(service, frank, "calc")
    r = httpx.post(f"{service.url}/v1/tasks/{task}/stream-token", headers=frank, timeout=HANG)
    assert r.status_code == 200, r.text
    minted = r.json()
    assert minted["expires_at"] > time.time() + 3000 and minted["events_url"].endswith(minted["token"])
    names = [e["event"] for e in events(service, {}, task, url=minted["events_url"])]
    assert names[0] == "status" and names[-1] == "stop"
    resumed = events(service, {}, task, last="1.0", url=minted["events_url"])  # EventSource's reconnect
    assert [e["event"] for e in resumed] == names[3:]

    def refused(path: str, token: str) -> dict:
        r = httpx.get(f"{service.url}{path}", params={"token": token}, timeout=HANG)
        assert r.status_code == 401, (path, r.status_code, r.text)
        return r.json()

    token = minted["token"]
    assert "not for this task" in refused(f"/v1/tasks/{other}/events", token)["error"]  # one task only
    refused(f"/v1/tasks/{task}/events", token[:-2] + ("AA" if not token.endswith("AA") else "BB"))  # tampered
    refused(f"/v1/tasks/{task}/events", "st_x.y")
    refused(f"/v1/tasks/{task}", token)  # only the stream: every other request still needs the key
    assert httpx.post(f"{service.url}/v1/tasks/{task}/stream-token", headers=grace, timeout=HANG).status_code == 404
    assert httpx.post(f"{service.url}/v1/tasks/{task}/stream-token", json={"ttl_seconds": 0},
                      headers=frank, timeout=HANG).status_code == 422
    short = httpx.post(f"{service.url}/v1/tasks/{task}/stream-token", json={"ttl_seconds": 1}, headers=frank, timeout=HANG).json()
    time.sleep(1.5)
    refused(f"/v1/tasks/{task}/events", short["token"])  # expired
    key_id = service.cli("keys", "list", "--user", "frank").stdout.split()[0]
    assert service.cli("keys", "revoke", key_id).returncode == 0
    refused(f"/v1/tasks/{task}/events", token)  # its key was revoked


def test_cors_lets_only_the_named_origins_call_from_a_browser(tmp_path: Path) -> None:
    svc = Service(tmp_path)
    refused = svc.cli("serve", "--agents", AGENTS, "--cors-origin", "https://console.test/app")
    assert refused.returncode == 2 and "--cors-origin takes an origin" in refused.stderr
    svc.start(AGENTS, "--cors-origin", "https://console.test")
    try:
        alice = svc.key("alice")
        page = {"Origin": "https://console.test"}
        pre = httpx.options(f"{svc.url}/v1/tasks", headers={**page, "Access-Control-Request-Method": "POST",
                                                             "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://console.test"
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        task = submit(svc, {**alice, **page}, "calc")
        token = httpx.post(f"{svc.url}/v1/tasks/{task}/stream-token", headers={**alice, **page}, timeout=HANG).json()["events_url"]
        with httpx.stream("GET", svc.url + token, headers=page, timeout=HANG) as r:  # EventSource, cross-origin
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://console.test"
        r = httpx.get(f"{svc.url}/v1/tasks", headers={**alice, "Origin": "https://elsewhere.test"}, timeout=HANG)
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # the browser blocks it
        r = httpx.get(f"{svc.url}/v1/tasks", headers=page, timeout=HANG)  # a refusal is readable by the page too
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://console.test"
    finally:
        svc.stop()


def test_idempotent_submission(service: Service) -> None:
    alice = service.key("dave")
    h = {**alice, "Idempotency-Key": "order-7"}
    first = httpx.post(service.url + "/v1/tasks", json={"prompt": "a", "agent": "calc"}, headers=h, timeout=HANG).json()
    again = httpx.post(service.url + "/v1/tasks", json={"prompt": "a", "agent": "calc"}, headers=h, timeout=HANG)
    assert again.status_code == 200 and again.json() == {"task_id": first["task_id"], "created": False}
    other = httpx.post(service.url + "/v1/tasks", json={"prompt": "b", "agent": "calc"}, headers=h, timeout=HANG)
    assert other.status_code == 409 and "different request" in other.json()["error"]
    assert len(httpx.get(f"{service.url}/v1/tasks", headers=alice, timeout=HANG).json()["tasks"]) == 1


def test_confirm_runs_exactly_the_pending_call_once(service: Service) -> None:
    alice = service.key("erin")
    before = len(service.ledger())
    task = submit(service, alice, "billing")
    body = wait_status(service, alice, task, "awaiting_approval")
    assert body["pending_approvals"] == [{"call_id": "c1", "tool": "charge", "arguments": {"amount": 99},
                                          "reason": body["pending_approvals"][0]["reason"],
                                          "provenance": {"amount": "model"}, "batch": "", "batch_summary": ""}]  # 99: in no source the run saw
    assert len(service.ledger()) == before
    wrong = httpx.post(f"{service.url}/v1/tasks/{task}/confirm", json={"call_id": "c9", "approved": True}, headers=alice, timeout=HANG)
    assert wrong.status_code == 409 and "waits on call 'c1'" in wrong.json()["error"]
    ok = httpx.post(f"{service.url}/v1/tasks/{task}/confirm", json={"call_id": "c1", "approved": True}, headers=alice, timeout=HANG)
    assert ok.status_code == 200, ok.text
    twice = httpx.post(f"{service.url}/v1/tasks/{task}/confirm", json={"call_id": "c1", "approved": True}, headers=alice, timeout=HANG)
    assert twice.status_code == 409
    body = wait_status(service, alice, task, "completed")
    assert body["answer"] == "Done: charged 99" and service.ledger()[before:] == ["charge 99"]
    names = [e["event"] for e in events(service, alice, task)]
    assert names.index("confirm_request") < names.index("answer")


def test_a_second_approval_with_the_same_call_id_in_a_later_turn_is_taken(service: Service) -> None:
    """Issue 24, item 10: call ids are unique only within one reply; decisions are keyed by the exact
    pending call (run, step, call id), so the second `c1` is not refused as already answered."""
    alice = service.key("erin2")
    before = len(service.ledger())
    task = submit(service, alice, "billing_twice")
    for _ in range(2):
        wait_status(service, alice, task, "awaiting_approval")
        ok = httpx.post(f"{service.url}/v1/tasks/{task}/confirm", json={"call_id": "c1", "approved": True},
                        headers=alice, timeout=HANG)
        assert ok.status_code == 200, ok.text
    body = wait_status(service, alice, task, "completed")
    assert service.ledger()[before:] == ["charge 99", "charge 5"]
    assert body["answer"].startswith("Done")


def test_deny_returns_the_refusal_to_the_model(service: Service) -> None:
    alice = service.key("frank")
    before = len(service.ledger())
    task = submit(service, alice, "billing")
    wait_status(service, alice, task, "awaiting_approval")
    r = httpx.post(f"{service.url}/v1/tasks/{task}/confirm", json={"call_id": "c1", "approved": False,
                                                                  "reason": "not today"}, headers=alice, timeout=HANG)
    assert r.status_code == 200
    body = wait_status(service, alice, task, "completed")
    assert "not today" in body["answer"] and len(service.ledger()) == before


def test_cancel_a_running_task(service: Service) -> None:
    alice = service.key("gina")
    task = submit(service, alice, "slow")
    wait_status(service, alice, task, "running")
    time.sleep(1)
    r = httpx.post(f"{service.url}/v1/tasks/{task}/cancel", headers=alice, timeout=HANG)
    assert r.status_code == 200
    body = wait_status(service, alice, task, "cancelled", "stopped")
    assert body["steps"] < 40
    assert events(service, alice, task)[-1]["event"] == "stop"
    again = httpx.post(f"{service.url}/v1/tasks/{task}/cancel", headers=alice, timeout=HANG)
    assert again.status_code == 409


def test_event_stream_resumes_across_a_restart(tmp_path: Path) -> None:
    service = Service(tmp_path)
    service.start()
    try:
        _resume_across_restart(service)
    finally:
        service.stop()


def _resume_across_restart(service: Service) -> None:
    alice = service.key("alice")
    task = submit(service, alice, "billing")
    wait_status(service, alice, task, "awaiting_approval")
    head = events(service, alice, task, limit=3)
    service.stop()
    service.start()
    httpx.post(f"{service.url}/v1/tasks/{task}/confirm", json={"call_id": "c1", "approved": True}, headers=alice, timeout=HANG)
    wait_status(service, alice, task, "completed")
    tail = events(service, alice, task, last=head[-1]["id"])
    full = events(service, alice, task)
    assert [e["id"] for e in head + tail] == [e["id"] for e in full]
    assert head + tail == full
    assert service.ledger() == ["charge 99"]


def test_global_concurrency_limits_running_tasks(tmp_path: Path) -> None:
    service = Service(tmp_path)
    service.start(AGENTS, "--global-concurrency", "1")
    try:
        alice = service.key("alice")
        tasks = [submit(service, alice, "booking", prompt=f"book {i}") for i in range(3)]
        most = 0
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            # one list request is one SELECT: a snapshot (three GETs in a row can see a task start before
            # the one read first was seen finishing, and count two running under load)
            listed = {t["task_id"]: t["status"] for t in httpx.get(f"{service.url}/v1/tasks", headers=alice, timeout=HANG).json()["tasks"]}
            statuses = [listed[t] for t in tasks]
            most = max(most, statuses.count("running"))
            if all(s == "completed" for s in statuses):
                break
            time.sleep(0.05)
        assert statuses == ["completed"] * 3 and most == 1
    finally:
        service.stop()


def test_openapi_spec(service: Service) -> None:
    spec = httpx.get(service.url + "/openapi.json", timeout=HANG).json()
    assert {"/v1/tasks", "/v1/tasks/{task_id}", "/v1/tasks/{task_id}/events", "/v1/tasks/{task_id}/confirm",
            "/v1/tasks/{task_id}/cancel", "/healthz"} <= set(spec["paths"])


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped after the test (tests/store_fixtures.py)."""
    from store_fixtures import fresh_postgres_database

    yield from fresh_postgres_database()


def test_two_workers_on_postgres_one_killed(tmp_path: Path, pg_database: str) -> None:
    """API-only server + two `tether worker`s on PostgreSQL; one is SIGKILLed with runs in flight: the
    other adopts them; every run completes; no side effect twice."""
    db = pg_database
    api = Service(tmp_path)
    api.env["TETHER_DB"] = db
    api.proc = None
    workers: dict[str, subprocess.Popen] = {}

    def worker(name: str) -> subprocess.Popen:
        env = {**api.env, "TETHER_EXECUTOR_ID": name}
        return subprocess.Popen([sys.executable, "-m", "tether.cli", "worker", "--agents", AGENTS, "--concurrency", "4"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    try:
        api.proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "serve", "--agents", AGENTS, "--port",
                                     str(api.port), "--workers", "0"], env=api.env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:  # the API first: it creates the schemas the workers use
            try:
                if httpx.get(api.url + "/healthz", timeout=HANG).status_code == 200:
                    break
            except httpx.HTTPError:
                assert api.proc.poll() is None, api.proc.stderr.read()
                time.sleep(0.3)
        workers["wa"], workers["wb"] = worker("wa"), worker("wb")
        alice = api.key("alice")
        tasks = [submit(api, alice, "booking", prompt=f"book {i}") for i in range(12)]
        psycopg = pytest.importorskip("psycopg")

        def on(executor: str) -> list[str]:
            with psycopg.connect(db) as conn:
                return [r[0] for r in conn.execute(
                    "SELECT workflow_uuid FROM dbos.workflow_status WHERE executor_id = %s AND status = 'PENDING'",
                    (executor,))]

        deadline = time.monotonic() + HANG
        while not on("wa") and time.monotonic() < deadline:
            time.sleep(0.2)
        in_flight = on("wa")
        assert in_flight, "worker wa never took a run"
        workers["wa"].send_signal(signal.SIGKILL)
        workers["wa"].wait()
        for task in tasks:
            body = wait_status(api, alice, task, "completed", "error", "stopped")
            assert body["status"] == "completed", body
        assert set(in_flight) <= set(tasks)  # the killed worker's runs were among those that completed
        lines = api.ledger()
        keys = [line.rsplit(" ", 1)[1] for line in lines]
        assert len(keys) == len(set(keys)) == 36, lines
    finally:
        for proc in [*workers.values(), api.proc]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_healthz_reports_a_lost_database_and_its_return(tmp_path: Path, pg_database: str) -> None:
    """The load balancer's check: 503 with a JSON reason while PostgreSQL refuses connections, 200
    again once it takes them, without restarting the server."""
    db = pg_database
    name = db.rsplit("/", 1)[1]
    psycopg = pytest.importorskip("psycopg")
    admin = os.environ["TETHER_TEST_POSTGRES"]
    api = Service(tmp_path)
    api.env["TETHER_DB"] = db
    log = (tmp_path / "serve.log").open("w")  # DBOS logs its retries while the database is gone
    api.proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "serve", "--agents", AGENTS, "--port",
                                 str(api.port), "--workers", "0"], env=api.env, stdout=subprocess.DEVNULL,
                                stderr=log, text=True)

    def health(want: int, timeout: float = HANG) -> httpx.Response:
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = httpx.get(api.url + "/healthz", timeout=10)  # one try of the loop: a slow one is tried again
                if r.status_code == want:
                    return r
            except httpx.HTTPError:
                pass
            assert api.proc is not None and api.proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"/healthz never answered {want}"
            time.sleep(0.3)

    def connections(allowed: bool) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
            if not allowed:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))

    try:
        assert health(200).json()["ok"] is True
        connections(False)
        down = health(503)
        assert "the database does not answer" in down.json()["error"]
        connections(True)
        assert health(200).json()["ok"] is True
    finally:
        connections(True)
        api.stop()
        log.close()


def test_schemathesis_finds_no_failure(tmp_path: Path) -> None:
    """schemathesis against the served spec: every response matches it, no 5xx, every check passes."""
    st = Path(sys.executable).with_name("st")
    if not st.exists():
        pytest.skip("schemathesis is not installed (it is in the dev extra)")
    service = Service(tmp_path)
    service.start(AGENTS.replace(":AGENTS", ":FUZZ_AGENTS"))
    try:
        key = service.key("fuzz")["Authorization"]
        done = subprocess.run([str(st), "run", f"{service.url}/openapi.json", "-H", f"Authorization: {key}",
                               "--checks", "all", "-n", "8", "--request-timeout", "20", "--seed", "1",
                               # a live task's event stream does not end while the task runs (tested above)
                               "--exclude-path-regex", "/events$"],
                              capture_output=True, text=True, timeout=HANG, env=service.env)
        assert done.returncode == 0, done.stdout[-3000:]
    finally:
        service.stop()
