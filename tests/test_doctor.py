"""`tether doctor`: one screen on the sandbox, the models configured, the embedded model and the run
store; exit 1 only when something configured is broken (issue 22, item 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hang import HANG
from typer.testing import CliRunner

from tether.cli._app import app
from tether.cli._doctor_cmd import run_checks


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    return {**keep, "TETHER_HOME": str(tmp_path / "home"), **extra}


def test_nothing_configured_is_not_broken(tmp_path: Path) -> None:
    checks = {c.part: c for c in run_checks(_env(tmp_path), load_model=False)}
    assert checks["models"].state == "missing"
    assert checks["run store"].state == "ok" and str(tmp_path / "home") in checks["run store"].detail
    assert checks["sandbox"].state in ("ok", "missing")


def test_a_configured_endpoint_without_a_key_is_broken(tmp_path: Path) -> None:
    env = _env(tmp_path, OPENAI_BASE_URL="https://api.example.com/v1")
    checks = {c.part: c for c in run_checks(env, load_model=False)}
    assert checks["model openai"].state == "broken" and "no API key" in checks["model openai"].detail
    result = CliRunner().invoke(app, ["doctor"], env={**env, "OPENAI_API_KEY": ""})
    assert result.exit_code == 1, result.output
    assert "BROKEN  model openai" in result.output and "1 broken: model openai" in result.output


def test_a_configured_database_that_cannot_open_is_broken_and_its_password_is_not_shown(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    checks = {c.part: c for c in run_checks(_env(tmp_path, TETHER_DB=str(blocker / "runs.db")), load_model=False)}
    assert checks["run store"].state == "broken"
    pg = "postgresql://tether:s3cret@127.0.0.1:1/none"
    checks = {c.part: c for c in run_checks(_env(tmp_path, TETHER_DB=pg), load_model=False)}
    assert checks["run store"].state == "broken" and "s3cret" not in checks["run store"].detail


def test_the_real_command_exits_by_what_is_broken(tmp_path: Path) -> None:
    tether = Path(sys.executable).with_name("tether")
    ok = subprocess.run([str(tether), "doctor"], env=_env(tmp_path), capture_output=True, text=True, timeout=HANG)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "nothing configured is broken" in ok.stdout
    bad = subprocess.run([str(tether), "doctor"], env=_env(tmp_path, OPENAI_BASE_URL="https://api.example.com/v1"),
                         capture_output=True, text=True, timeout=HANG)
    assert bad.returncode == 1 and "BROKEN" in bad.stdout, bad.stdout + bad.stderr


def _corrupt_store(path: Path) -> None:
    """A run store whose schema reads but whose last data pages are garbage (a disk that lost writes)."""
    from tether.store import RunStore

    store = RunStore(str(path))
    for i in range(200):
        store.create_run(f"r{i}", "agent", "alice", "x" * 2000)
    store.close()
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.seek(size - 4096 * 20)
        fh.write(b"\xff" * 4096 * 10)


def test_a_corrupt_run_store_is_broken_and_the_runs_commands_say_so_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    _corrupt_store(db)
    checks = {c.part: c for c in run_checks(_env(tmp_path, TETHER_DB=str(db)), load_model=False)}
    assert checks["run store"].state == "broken" and "corrupt" in checks["run store"].detail, checks["run store"]
    tether = Path(sys.executable).with_name("tether")
    for args in (["runs"], ["runs", "stats"]):
        done = subprocess.run([str(tether), *args, "--db", str(db)], env=_env(tmp_path), capture_output=True,
                              text=True, timeout=HANG)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr == f"tether: cannot read the run database {db}: DatabaseError: database disk image is " \
                              "malformed (`tether doctor` checks it)\n", (args, done.stderr)


# ---- probes: one real request to each configured model, one span to the collector ----------------


def test_the_probe_sends_each_configured_model_one_real_request(tmp_path: Path) -> None:
    from fake_openai_server import FakeOpenAIServer, Reply, chat_completion

    with FakeOpenAIServer([chat_completion("ok", prompt_tokens=9, completion_tokens=1)]) as good:
        env = _env(tmp_path, OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=good.base_url)
        (check,) = [c for c in run_checks(env, load_model=False, probe=True) if c.part == "model openai"]
    assert check.state == "ok" and "(10 tokens)" in check.detail, check
    assert good.requests[0].body["max_tokens"] == 1
    with FakeOpenAIServer([Reply.error(401, "invalid api key")] * 3) as bad:
        env = _env(tmp_path, OPENAI_API_KEY="sk-wrong", OPENAI_BASE_URL=bad.base_url)
        (check,) = [c for c in run_checks(env, load_model=False, probe=True) if c.part == "model openai"]
        unprobed = [c for c in run_checks(env, load_model=False, probe=False) if c.part == "model openai"]
    assert check.state == "broken" and "one-token request failed" in check.detail and "check the key" in check.detail
    assert unprobed[0].state == "ok"  # without the probe only the configuration is read


def test_the_probe_exports_one_span_to_the_collector_or_says_it_could_not(tmp_path: Path) -> None:
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    import pytest

    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="tether[otel] is not installed")
    paths: list[str] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}")
        (ok,) = [c for c in run_checks(env, load_model=False, probe=True) if c.part == "telemetry"]
    finally:
        collector.shutdown()
    assert ok.state == "ok" and paths == ["/v1/traces"], ok
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{dead}")
    (broken,) = [c for c in run_checks(env, load_model=False, probe=True) if c.part == "telemetry"]
    assert broken.state == "broken" and "could not be exported" in broken.detail
    (absent,) = [c for c in run_checks(_env(tmp_path), load_model=False, probe=True) if c.part == "telemetry"]
    assert absent.state == "missing"


def test_the_store_check_takes_a_real_write_so_a_locked_store_is_broken(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "runs.db"
    env = _env(tmp_path, TETHER_DB=str(db))
    (ok,) = [c for c in run_checks(env, load_model=False) if c.part == "run store"]
    assert ok.state == "ok"
    holder = sqlite3.connect(db, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing, or a stuck one
    try:
        (locked,) = [c for c in run_checks(env, load_model=False) if c.part == "run store"]
    finally:
        holder.rollback()
        holder.close()
    assert locked.state == "broken" and "locked" in locked.detail, locked
    tables = sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE name = 'tether_doctor'").fetchall()
    assert tables == []  # the write was rolled back


def test_a_bad_encoder_file_is_broken_with_the_fix(tmp_path: Path) -> None:
    import pytest

    pytest.importorskip("onnxruntime", reason="the rag extra is not installed")
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not an onnx graph")
    os.environ["TETHER_EMBED_MODEL"] = str(bad)
    try:
        (check,) = [c for c in run_checks(_env(tmp_path), load_model=True, probe=True) if c.part == "encoder"]
    finally:
        del os.environ["TETHER_EMBED_MODEL"]
    assert check.state == "broken" and "TETHER_EMBED_MODEL" in check.detail, check
