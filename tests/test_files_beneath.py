"""File tools resolve paths beneath the workspace at the moment of use: a directory swapped for a
symbolic link while they run never sends a read or a write outside, and writes replace the file
(a hard link to a file outside is not written through). Both resolvers are exercised: openat2 and
the O_NOFOLLOW descriptor walk used where the kernel lacks it."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tether.tools import _beneath
from tether.tools._base import Tool
from tether.tools.builtin import file_tools


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    if request.param == "openat2":
        monkeypatch.setattr(_beneath, "use_openat2", None)
        if not _beneath.openat2_available(os.open(tmp_path, os.O_RDONLY)):
            pytest.skip("this kernel has no openat2 (the descriptor walk is tested instead)")
    else:
        monkeypatch.setattr(_beneath, "use_openat2", False)
    return request.param


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_text("inside\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "f.txt").write_text("OUTSIDE\n")
    (out / "marker-outside").mkdir()
    return out


def run(tool: Tool, **args: Any) -> Any:
    return tool.fn(**tool.validator.validate(args))


def tools_for(root: Path) -> dict[str, Tool]:
    return {t.name: t for t in file_tools(root)}


# --- the race ------------------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE), as an attacker in the sandbox would."""
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@pytest.fixture
def swapper(ws: Path, outside: Path) -> Iterator[threading.Event]:
    """A thread that keeps swapping ws/d (a directory) with ws/e (a symbolic link to `outside`)."""
    (ws / "e").symlink_to(outside, target_is_directory=True)
    try:
        _exchange(ws / "d", ws / "e")
        _exchange(ws / "d", ws / "e")
    except OSError as exc:
        pytest.skip(f"renameat2(RENAME_EXCHANGE) is not available here: {exc}")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            _exchange(ws / "d", ws / "e")

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    yield stop
    stop.set()
    thread.join()


def test_swapping_a_directory_for_a_symlink_never_sends_io_outside(
    resolver: str, ws: Path, outside: Path, swapper: threading.Event
) -> None:
    tools = tools_for(ws)
    outcomes: dict[str, int] = {"ok": 0, "refused": 0}
    leaked: list[str] = []
    errors: list[str] = []

    def one(i: int) -> None:
        calls: list[tuple[str, dict[str, Any]]] = [
            ("Write", {"file_path": f"d/new-{i}.txt", "content": "x"}),
            ("Read", {"file_path": "d/f.txt"}),
            ("Edit", {"file_path": "d/f.txt", "old_string": "i", "new_string": "i"}),  # refused: identical
            ("Write", {"file_path": f"d/sub-{i}/deeper.txt", "content": "y"}),
            ("Grep", {"pattern": "OUTS[I]DE|inside"}),
            ("Grep", {"pattern": "OUTS[I]DE", "path": "d"}),
            ("Glob", {"pattern": "**/*", "path": "d"}),
        ]
        name, args = calls[i % len(calls)]
        try:
            out = run(tools[name], **args)
        except Exception as exc:  # every failure must be a ValueError: checked below
            outcomes["refused"] += 1
            if not isinstance(exc, ValueError):
                errors.append(repr(exc))
            if "OUTSIDE" in str(exc):
                leaked.append(f"{name}: {exc}")
            return
        outcomes["ok"] += 1
        if "OUTSIDE" in out or "marker-outside" in out:
            leaked.append(f"{name}: {out[:80]}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(2_100)))
    swapper.set()

    assert leaked == []
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt", "marker-outside"], "a write landed outside the workspace"
    assert (outside / "f.txt").read_text() == "OUTSIDE\n"
    assert errors == []  # every refusal is a message the model can act on
    # The race really ran: some calls found the link in place (refused), others the directory (done).
    assert outcomes["ok"] > 50 and outcomes["refused"] > 50, outcomes


# --- hard links and modes ------------------------------------------------------------------------


def test_write_and_edit_replace_a_hard_link_instead_of_writing_through_it(
    resolver: str, ws: Path, outside: Path
) -> None:
    os.link(outside / "f.txt", ws / "h.txt")
    os.link(outside / "f.txt", ws / "h2.txt")
    tools = tools_for(ws)
    run(tools["Write"], file_path="h.txt", content="changed\n")
    assert (outside / "f.txt").read_text() == "OUTSIDE\n"
    assert run(tools["Edit"], file_path="h2.txt", old_string="OUTSIDE", new_string="edited") == (
        "Replaced 1 occurrence in h2.txt")
    assert (outside / "f.txt").read_text() == "OUTSIDE\n"
    assert (ws / "h.txt").read_text() == "changed\n"
    assert (ws / "h2.txt").read_text() == "edited\n"
    assert os.stat(outside / "f.txt").st_nlink == 1


def test_replacing_keeps_the_permission_bits_and_leaves_no_temp_file(resolver: str, ws: Path) -> None:
    script = ws / "d" / "run.sh"
    script.write_text("echo a\n")
    script.chmod(0o750)
    tools = tools_for(ws)
    run(tools["Edit"], file_path="d/run.sh", old_string="a", new_string="b")
    run(tools["Write"], file_path="d/f.txt", content="new\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert script.read_text() == "echo b\n"
    assert sorted(p.name for p in (ws / "d").iterdir()) == ["f.txt", "run.sh"]


def test_a_failed_replace_leaves_no_temp_file(resolver: str, ws: Path) -> None:
    (ws / "d" / "sub").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        run(tools_for(ws)["Write"], file_path="d/sub", content="x")
    assert sorted(p.name for p in (ws / "d").iterdir()) == ["f.txt", "sub"]


# --- what the resolver refuses -------------------------------------------------------------------


def test_symlinks_anywhere_on_the_path_are_refused(resolver: str, ws: Path, outside: Path) -> None:
    (ws / "e").symlink_to(outside, target_is_directory=True)
    (ws / "d" / "in").symlink_to(ws / "d", target_is_directory=True)
    tools = tools_for(ws)
    for path in ("e/f.txt", "d/in/f.txt", "e", "d/in"):
        with pytest.raises(ValueError, match="symbolic link"):
            run(tools["Read"], file_path=path)
        with pytest.raises(ValueError, match="symbolic link"):
            run(tools["Write"], file_path=path + "/x.txt", content="x")
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt", "marker-outside"]


def test_a_fifo_does_not_hang_read_or_grep(resolver: str, ws: Path) -> None:
    os.mkfifo(ws / "d" / "pipe")
    tools = tools_for(ws)
    with pytest.raises(ValueError, match="not a regular file"):
        run(tools["Read"], file_path="d/pipe")
    assert run(tools["Grep"], pattern="inside") == "d/f.txt:1:inside"


def test_open_beneath_refuses_dotdot_and_absolute(resolver: str, ws: Path) -> None:
    root = os.open(ws / "d", os.O_RDONLY)
    try:
        for path in ("../d/f.txt", str(ws / "d" / "f.txt")):
            with pytest.raises(OSError) as info:
                os.close(_beneath.open_beneath(root, path, os.O_RDONLY))
            assert info.value.errno in (errno.EXDEV, errno.ENOENT, errno.ELOOP)
        os.close(_beneath.open_beneath(root, "f.txt", os.O_RDONLY))
    finally:
        os.close(root)


def test_write_and_edit_refuse_git_and_protected_paths(ws: Path) -> None:
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / "sub").mkdir()
    (ws / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
    (ws / ".envrc").write_text("export A=1\n")
    tools = {t.name: t for t in file_tools(ws, protect=[".envrc", ".vscode"])}
    for path in (".git/hooks/pre-commit", "d/../.git/config", "sub/.git", ".envrc", ".vscode/tasks.json"):
        with pytest.raises(ValueError, match="runs later, outside the sandbox"):
            run(tools["Write"], file_path=path, content="touch PWNED\n")
    for path, old in ((".git/config", "[core]"), (".envrc", "A=1"), ("sub/.git", "gitdir")):
        with pytest.raises(ValueError, match="runs later, outside the sandbox"):
            run(tools["Edit"], file_path=path, old_string=old, new_string="x")
    assert not (ws / ".git" / "hooks" / "pre-commit").exists() and not (ws / ".vscode").exists()
    assert (ws / ".git" / "config").read_text() == "[core]\n" and (ws / ".envrc").read_text() == "export A=1\n"
    assert run(tools["Write"], file_path="gitnotes/.gitignore", content="x\n").startswith("Created")
