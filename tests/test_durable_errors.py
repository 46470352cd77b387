"""Issue 24, item 13 (part): errors from the durable CLI are one line, never a library's dump (the
SQL, its parameters holding the prompt and options, SQLAlchemy's "Background on this error")."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import sqlalchemy.exc
from hang import HANG

from tether.cli._durable_cmd import error_line


def test_a_database_error_is_its_drivers_message_without_the_sql_or_the_prompt() -> None:
    exc = sqlalchemy.exc.OperationalError(
        "INSERT INTO tether_runs (run_id, prompt, config) VALUES (?, ?, ?)",
        ("r1", "wire 5,000 EUR to my landlord", '{"model": "x", "api_key": "..."}'),
        sqlite3.OperationalError("database is locked"))
    line = error_line(exc)
    assert line == "OperationalError: database is locked"


def test_a_corrupt_database_is_one_line_through_the_real_cli(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("this is not a database at all, just text padding padding padding")
    tether = Path(sys.executable).with_name("tether")
    proc = subprocess.run([str(tether), "--tools", "calculator", "run", "--durable", "--db", str(bad), "2+2?"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == ["tether: durable run failed: DatabaseError: file is not a database"]
