"""`tether doctor`: one screen on the sandbox, the models configured, the embedded model and the run
store; exit 1 only when something configured is broken (issue 22, item 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    ok = subprocess.run([str(tether), "doctor"], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "nothing configured is broken" in ok.stdout
    bad = subprocess.run([str(tether), "doctor"], env=_env(tmp_path, OPENAI_BASE_URL="https://api.example.com/v1"),
                         capture_output=True, text=True, timeout=120)
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
                              text=True, timeout=120)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr == f"tether: cannot read the run database {db}: DatabaseError: database disk image is " \
                              "malformed (`tether doctor` checks it)\n", (args, done.stderr)
