"""Every CLI run is recorded in the run store by default: `tether runs`, `runs stats` and the console
see it; --no-store and TETHER_STORE=off skip it; a store that fails costs a warning line, never the
answer; a store path that cannot be opened is an error for the commands that read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from hang import HANG

PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "TETHER_", "ANTHROPIC_")


def _env(server: FakeOpenAIServer | None, db: Path | str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    if server is not None:
        env.update(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=server.base_url)
    env.update(TETHER_DB=str(db), **extra)
    return env


def tether(args: list[str], *, cwd: Path, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=HANG)


def _runs(tmp_path: Path, db: Path) -> list[dict]:
    proc = tether(["runs", "--json"], cwd=tmp_path, env=_env(None, db))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_print_mode_runs_are_stored_with_their_events(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    script = [chat_completion(None, [tool_call("calculator", {"expression": "6 * 7"})]), chat_completion("42"),
              chat_completion("hello")]
    with FakeOpenAIServer(script) as server:
        first = tether(["-p", "What is 6 * 7?", "--tools", "calculator"], cwd=tmp_path, env=_env(server, db))
        second = tether(["run", "say hello", "--tools", "none"], cwd=tmp_path, env=_env(server, db))
    assert (first.returncode, first.stdout, first.stderr) == (0, "42\n", "")
    assert (second.returncode, second.stdout) == (0, "hello\n")
    rows = _runs(tmp_path, db)
    assert [(r["prompt"], r["status"], r["answer"], r["agent"]) for r in rows] == [
        ("say hello", "completed", "hello", "cli"), ("What is 6 * 7?", "completed", "42", "cli")]
    assert rows[1]["steps"] == 2 and rows[1]["usage"]["tool_calls"] == 1

    shown = tether(["runs", rows[1]["run_id"], "--events", "--json"], cwd=tmp_path, env=_env(None, db))
    kinds = [e["kind"] for e in json.loads(shown.stdout)["events"]]
    assert kinds.count("model_call") == 2 and "tool_call" in kinds and "text_delta" not in kinds

    stats = tether(["runs", "stats", "--by", "tool", "--json"], cwd=tmp_path, env=_env(None, db))
    assert [(r["key"], r["runs"], r["tool_calls"]) for r in json.loads(stats.stdout)] == [("calculator", 1, 1)]
    listed = tether(["runs"], cwd=tmp_path, env=_env(None, db))
    assert listed.stdout.count("completed") == 2


def test_each_chat_turn_is_a_stored_run(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with FakeOpenAIServer([chat_completion("one"), chat_completion("two")]) as server:
        proc = tether(["chat", "--tools", "none"], cwd=tmp_path, env=_env(server, db), stdin="first\nsecond\n")
    assert proc.returncode == 0, proc.stderr
    assert [(r["prompt"], r["answer"]) for r in _runs(tmp_path, db)] == [("second", "two"), ("first", "one")]


def test_no_store_flag_and_variable_keep_runs_out(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with FakeOpenAIServer([chat_completion("a"), chat_completion("b"), chat_completion("c")]) as server:
        flag = tether(["-p", "x", "--tools", "none", "--no-store"], cwd=tmp_path, env=_env(server, db))
        sub = tether(["run", "x", "--tools", "none", "--no-store"], cwd=tmp_path, env=_env(server, db))
        var = tether(["-p", "x", "--tools", "none"], cwd=tmp_path, env=_env(server, db, TETHER_STORE="off"))
    assert [p.stdout for p in (flag, sub, var)] == ["a\n", "b\n", "c\n"]
    assert not db.exists()  # not even opened
    empty = tether(["runs"], cwd=tmp_path, env=_env(None, db))
    assert (empty.returncode, empty.stdout.strip()) == (0, f"no runs stored in {db}")


def test_a_store_that_fails_costs_one_warning_not_the_answer(tmp_path: Path) -> None:
    db = tmp_path / "missing" / "runs.db"
    with FakeOpenAIServer([chat_completion("the answer")]) as server:
        proc = tether(["-p", "x", "--tools", "none"], cwd=tmp_path, env=_env(server, db))
    assert (proc.returncode, proc.stdout) == (0, "the answer\n")
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("tether: warning: run ") and "not stored" in line and str(db.parent) in line
    assert not db.parent.exists()  # a path given is never made up


def test_reading_a_store_that_cannot_be_opened_is_an_error(tmp_path: Path) -> None:
    db = tmp_path / "nonexistent" / "dir" / "x.db"
    for args in (["runs", "stats"], ["runs"]):
        proc = tether(args, cwd=tmp_path, env=_env(None, db))
        assert proc.returncode == 1, (args, proc.stdout)
        assert proc.stdout == ""
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith("tether: cannot open the run store") and "does not exist" in line
    assert not (tmp_path / "nonexistent").exists()


def test_the_console_shows_cli_runs_to_the_user_of_the_login_name(tmp_path: Path) -> None:
    import getpass
    import importlib.util
    import re

    import pytest

    for module in ("httpx", "dbos", "fastapi", "jinja2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (tether[serve])")
    import httpx
    from test_service import Service

    svc = Service(tmp_path)
    with FakeOpenAIServer([chat_completion("Quellport")]) as server:
        env = {**svc.env, "OPENROUTER_API_KEY": "sk-test", "OPENROUTER_BASE_URL": server.base_url}
        env = {k: v for k, v in env.items() if k not in ("TETHER_DB", "TETHER_STORE", "TETHER_MODEL")}
        run = tether(["-p", "capital of Zorbania?", "--tools", "none"], cwd=tmp_path, env=env)
    assert (run.returncode, run.stdout) == (0, "Quellport\n"), run.stderr
    svc.start()
    try:
        key = svc.key(getpass.getuser())["Authorization"].removeprefix("Bearer ")
        client = httpx.Client(base_url=svc.url, timeout=HANG)
        token = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
        assert token
        assert client.post("/login", data={"csrf": token.group(1), "key": key}).status_code == 303
        listing = client.get("/runs")
        assert listing.status_code == 200 and "capital of Zorbania?" in listing.text
        run_id = re.search(r'href="/runs/([0-9a-f]{12})"', listing.text)
        assert run_id
        page = client.get(f"/runs/{run_id.group(1)}")
        assert page.status_code == 200 and "Quellport" in page.text
    finally:
        svc.stop()
