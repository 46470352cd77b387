"""Module shadowing: files the agent writes into the working directory (json.py, socket.py, ssl.py,
typer.py, sitecustomize.py, a tether/ package ...) are never imported by tether's own Python on the
next run, started any of the ways a user starts it; where `python -m tether` cannot avoid it, it
refuses to run. Real subprocesses; the installed command is the repository's `.venv/bin/tether`
(scripts/bootstrap makes it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion
from hang import HANG

REPO = Path(__file__).resolve().parents[1]
INSTALLED = REPO / ".venv" / "bin" / "tether"
SHADOWS = ("json", "socket", "ssl", "typer", "rich", "pydantic", "openai", "re", "enum", "typing", "asyncio")
PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "ANTHROPIC_", "TETHER_")


def plant(where: Path, name: str) -> None:
    """A module (or, for "tether", a package) that leaves IMPORTED-<name> behind if it is ever imported."""
    code = f"import pathlib\npathlib.Path({str(where)!r}, 'IMPORTED-{name}').write_text('x')\n"
    if name == "tether":
        (where / "tether").mkdir()
        (where / "tether" / "__init__.py").write_text(code)
        (where / "tether" / "__main__.py").write_text(code)
    else:
        (where / f"{name}.py").write_text(code)


def imported(where: Path) -> list[str]:
    return sorted(p.name for p in where.glob("IMPORTED-*"))


def env_with(pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONSAFEPATH", "PYTHONPATH") and not k.startswith(PROVIDER_VARS)}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    for name in SHADOWS:
        plant(tmp_path, name)
    return tmp_path


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "tether.cli", "--version"],
    [sys.executable, "-m", "tether", "--version"],
    [str(REPO / "your_program.sh"), "--version"],
    [str(INSTALLED), "--version"],
], ids=["python -m tether.cli", "python -m tether", "your_program.sh", "tether"])
def test_modules_written_in_the_working_directory_are_not_imported(planted: Path, argv: list[str]) -> None:
    env = env_with(f"::.:{os.environ.get('PYTHONPATH', '')}")  # empty and relative entries mean the cwd too
    proc = subprocess.run(argv, cwd=planted, env=env, capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tether ")
    assert imported(planted) == []


# ----- the installed command: nothing from the working directory, before anything is imported --------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A working directory holding what runs before any program code: sitecustomize.py, json.py and a
    whole tether/ package."""
    for name in ("sitecustomize", "usercustomize", "json", "tether"):
        plant(tmp_path, name)
    return tmp_path


@pytest.mark.parametrize("pythonpath", [None, ":/opt/nothing-here", "::.:/opt/nothing-here"],
                         ids=["unset", "an empty entry", "empty and relative entries"])
def test_the_tether_command_imports_nothing_from_the_working_directory(workspace: Path, pythonpath: str | None,
                                                                        ) -> None:
    # ":/opt/x" is what `export PYTHONPATH=$PYTHONPATH:/opt/x` gives when PYTHONPATH was unset.
    proc = subprocess.run([str(INSTALLED), "--version"], cwd=workspace, env=env_with(pythonpath),
                          capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tether ")
    assert imported(workspace) == []


def test_the_tether_command_is_a_launcher_not_a_python_entry_point() -> None:
    # A Python script runs `site` (and so any sitecustomize.py on sys.path) before its first line.
    assert INSTALLED.read_bytes().startswith(b"#!/bin/sh\n")


def test_user_tools_still_import_from_absolute_pythonpath_entries(workspace: Path, tmp_path_factory: pytest.TempPathFactory,
                                                                  ) -> None:
    tools = tmp_path_factory.mktemp("tools")
    (tools / "shadowtest_tools.py").write_text("def double(x: int) -> int:\n    'Twice x.'\n    return 2 * x\n")
    with FakeOpenAIServer([chat_completion("done")]) as server:
        proc = subprocess.run(
            [str(INSTALLED), "-p", "hi", "--tools", "shadowtest_tools:double", "--base-url", server.base_url,
             "--api-key", "k"],
            cwd=workspace, env=env_with(f":{tools}"), capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert [t["function"]["name"] for t in server.requests[0].body["tools"]] == ["double"]
    assert imported(workspace) == []


# ----- python -m tether: refused where what ran first came from the working directory -------------------


@pytest.mark.parametrize("module", ["tether", "tether.cli"])
def test_python_m_refuses_after_a_sitecustomize_from_the_working_directory(tmp_path: Path, module: str) -> None:
    plant(tmp_path, "sitecustomize")  # `site` imports it (an empty PYTHONPATH entry) before any tether code
    proc = subprocess.run([sys.executable, "-m", module, "--version"], cwd=tmp_path,
                          env=env_with(f":{REPO / 'src'}"), capture_output=True, text=True, timeout=HANG)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(lines) == 1 and lines[0].startswith("tether: refusing to start: sitecustomize was imported from")
    assert "`tether` command" in lines[0] and "python -P -m tether" in lines[0]


def test_python_m_refuses_a_tether_package_from_the_working_directory() -> None:
    # Here the copy in the working directory is tether's own (src/): detectable, so refused; a planted
    # copy would run instead of this one, which is why the docs say to use the `tether` command.
    proc = subprocess.run([sys.executable, "-m", "tether", "--version"], cwd=REPO / "src", env=env_with(None),
                          capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("tether: refusing to start: tether was imported from")
    assert proc.stderr.count("\n") == 1


def test_python_safe_path_with_an_empty_pythonpath_entry_imports_nothing_from_the_working_directory(
        planted: Path) -> None:
    # -P keeps sys.path[0] out, but an empty PYTHONPATH entry still puts the working directory on sys.path.
    proc = subprocess.run([sys.executable, "-P", "-m", "tether", "--version"], cwd=planted,
                          env=env_with(f":{REPO / 'src'}"), capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert imported(planted) == []


def test_the_mcp_stdio_launcher_imports_nothing_from_the_working_directory(tmp_path: Path) -> None:
    from tether.mcp._client import _dying_with_us

    if not sys.platform.startswith("linux"):
        pytest.skip("the launcher is Linux-only")
    for name in ("ctypes", "signal", "os"):
        (tmp_path / f"{name}.py").write_text(f"open({str(tmp_path / ('IMPORTED-' + name))!r}, 'w').close()\n")
    program, args = _dying_with_us("true", [])
    done = subprocess.run([program, *args], cwd=tmp_path, capture_output=True, text=True, timeout=HANG,
                          env={**os.environ, "PYTHONPATH": ":"})
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("IMPORTED-*"))


def test_a_user_tool_module_leaves_the_working_directory_off_sys_path(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.cli._user_tools import import_tools

    (tmp_path / "my_tools_for_shadowing.py").write_text("def ping() -> str:\n    return 'pong'\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    (found,) = import_tools("my_tools_for_shadowing:ping")
    assert found.name == "ping"
    assert sys.path == before
