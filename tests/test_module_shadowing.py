"""Module shadowing: files the agent writes into the working directory (json.py, socket.py, ssl.py,
typer.py ...) are never imported by tether's own Python on the next run, started any of the ways a
user starts it. Real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHADOWS = ("json", "socket", "ssl", "typer", "rich", "pydantic", "openai", "re", "enum", "typing", "asyncio")


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(
            f"import pathlib\npathlib.Path({str(tmp_path)!r}, 'IMPORTED-{name}').write_text('x')\n")
    return tmp_path


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "tether.cli", "--version"],
    [sys.executable, "-m", "tether", "--version"],
    [str(REPO / "your_program.sh"), "--version"],
], ids=["python -m tether.cli", "python -m tether", "your_program.sh"])
def test_modules_written_in_the_working_directory_are_not_imported(planted: Path, argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = f"::.:{env.get('PYTHONPATH', '')}"  # empty and relative entries mean the cwd too
    proc = subprocess.run(argv, cwd=planted, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tether ")
    assert sorted(p.name for p in planted.glob("IMPORTED-*")) == []
