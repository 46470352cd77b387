"""Workspace file tools: behaviour, paging, edits, search, and confinement to the root."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether._types import Effect
from tether.tools._base import Tool
from tether.tools.builtin import file_tools
from tether.tools.builtin._files import GlobPattern, Workspace, read_tool


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "a.py").write_text("import os\n\ndef alpha():\n    return 1\n")
    (root / "src" / "pkg" / "b.py").write_text("def beta():\n    return 'TODO'\n")
    (root / "src" / "main.ts").write_text("const x = 1;\n")
    (root / "README.md").write_text("# Title\nSome text\n")
    (root / "node_modules" / "dep").mkdir(parents=True)
    (root / "node_modules" / "dep" / "index.py").write_text("def alpha(): pass\n")
    (root / "blob.bin").write_bytes(b"\x00\x01def alpha\x00")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("TOP SECRET def alpha\n")
    return out


@pytest.fixture
def tools(ws: Path) -> dict[str, Tool]:
    return {t.name: t for t in file_tools(ws)}


def run(tool: Tool, **args: Any) -> Any:
    return tool.fn(**tool.validator.validate(args))


# --- the set -------------------------------------------------------------------------------------


def test_names_effects_and_trust(ws: Path) -> None:
    tools = file_tools(ws)
    assert [t.name for t in tools] == ["Read", "Write", "Edit", "Glob", "Grep"]
    by_name = {t.name: t for t in tools}
    assert by_name["Read"].effect is Effect.READ_ONLY
    assert by_name["Glob"].effect is Effect.READ_ONLY
    assert by_name["Grep"].effect is Effect.READ_ONLY
    assert by_name["Write"].effect is Effect.REVERSIBLE
    assert by_name["Edit"].effect is Effect.REVERSIBLE
    assert by_name["Read"].untrusted_output and by_name["Grep"].untrusted_output
    assert not by_name["Write"].untrusted_output
    assert set(by_name["Read"].parameters["properties"]) == {"file_path", "offset", "limit"}
    assert set(by_name["Edit"].parameters["properties"]) == {
        "file_path",
        "old_string",
        "new_string",
        "replace_all",
    }
    assert set(by_name["Grep"].parameters["properties"]) == {"pattern", "path", "glob"}
    assert [t.name for t in file_tools(ws, read_only=True)] == ["Read", "Glob", "Grep"]


def test_root_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an existing directory"):
        file_tools(tmp_path / "nope")


# --- Read ----------------------------------------------------------------------------------------


def test_read_returns_exact_contents(ws: Path, tools: dict[str, Tool]) -> None:
    (ws / "crlf.txt").write_bytes(b"one\r\ntwo\r\nno newline at end")
    assert run(tools["Read"], file_path="README.md") == "# Title\nSome text\n"
    assert run(tools["Read"], file_path="crlf.txt") == "one\r\ntwo\r\nno newline at end"
    assert run(tools["Read"], file_path=str(ws / "src/pkg/a.py")) == (ws / "src/pkg/a.py").read_text()
    (ws / "empty.txt").write_text("")
    assert run(tools["Read"], file_path="empty.txt") == ""


def test_read_paging(ws: Path, tools: dict[str, Tool]) -> None:
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    page = run(tools["Read"], file_path="long.txt", offset=10, limit=3)
    assert page == "line 10\nline 11\nline 12\n[lines 10-12 shown; more follow: continue with offset=13]"
    assert run(tools["Read"], file_path="long.txt", offset=99) == "line 99\nline 100\n"
    assert run(tools["Read"], file_path="long.txt", limit=2).startswith("line 1\nline 2\n[lines 1-2 shown")
    assert run(tools["Read"], file_path="long.txt", offset=0, limit=1).startswith("line 1\n")
    with pytest.raises(ValueError, match=r"past the end of 'long\.txt', which has 100 lines"):
        run(tools["Read"], file_path="long.txt", offset=500)
    with pytest.raises(ValueError, match="limit"):
        tools["Read"].validator.validate({"file_path": "long.txt", "limit": 0})


def test_read_errors(ws: Path, tools: dict[str, Tool]) -> None:
    with pytest.raises(ValueError, match=r"file not found: 'missing\.txt'"):
        run(tools["Read"], file_path="missing.txt")
    with pytest.raises(ValueError, match="is a directory"):
        run(tools["Read"], file_path="src")
    with pytest.raises(ValueError, match="binary"):
        run(tools["Read"], file_path="blob.bin")
    with pytest.raises(ValueError, match="binary"):
        run(tools["Read"], file_path="blob.bin", offset=1)
    with pytest.raises(ValueError, match="empty"):
        run(tools["Read"], file_path="  ")


def test_read_refuses_huge_file_whole_but_pages_it(ws: Path) -> None:
    small = read_tool(ws, max_file_bytes=1_000)
    (ws / "big.txt").write_text("x" * 50 + "\n" + "y" * 2_000 + "\n")
    with pytest.raises(ValueError, match=r"2,052 bytes, over the 1,000-byte limit.*offset and limit"):
        run(small, file_path="big.txt")
    assert run(small, file_path="big.txt", offset=1, limit=1).startswith("x" * 50 + "\n[lines 1-1 shown")


# --- Write / Edit --------------------------------------------------------------------------------


def test_write_creates_parents_and_overwrites(ws: Path, tools: dict[str, Tool]) -> None:
    msg = run(tools["Write"], file_path="new/deep/file.txt", content="hello\nworld\n")
    assert msg == "Created new/deep/file.txt (2 lines, 12 characters)"
    assert (ws / "new/deep/file.txt").read_text() == "hello\nworld\n"
    msg = run(tools["Write"], file_path=str(ws / "new/deep/file.txt"), content="bye")
    assert msg.startswith("Overwrote new/deep/file.txt")
    assert (ws / "new/deep/file.txt").read_bytes() == b"bye"
    with pytest.raises(ValueError, match="is a directory"):
        run(tools["Write"], file_path="src", content="x")
    with pytest.raises(ValueError, match="cannot write"):
        run(tools["Write"], file_path="README.md/child.txt", content="x")


def test_edit_unique_replace(ws: Path, tools: dict[str, Tool]) -> None:
    msg = run(tools["Edit"], file_path="src/pkg/a.py", old_string="return 1", new_string="return 2")
    assert msg == "Replaced 1 occurrence in src/pkg/a.py"
    assert (ws / "src/pkg/a.py").read_text() == "import os\n\ndef alpha():\n    return 2\n"


def test_edit_not_unique_and_replace_all(ws: Path, tools: dict[str, Tool]) -> None:
    (ws / "dup.txt").write_text("a = 1\nb = 1\nc = 1\n")
    with pytest.raises(ValueError, match=r"matches 3 places in 'dup\.txt'.*replace_all"):
        run(tools["Edit"], file_path="dup.txt", old_string="= 1", new_string="= 2")
    assert (ws / "dup.txt").read_text() == "a = 1\nb = 1\nc = 1\n"
    msg = run(tools["Edit"], file_path="dup.txt", old_string="= 1", new_string="= 2", replace_all=True)
    assert msg == "Replaced 3 occurrences in dup.txt"
    assert (ws / "dup.txt").read_text() == "a = 2\nb = 2\nc = 2\n"


def test_edit_missing_and_bad_input(ws: Path, tools: dict[str, Tool]) -> None:
    with pytest.raises(ValueError, match=r"not found in 'src/pkg/a.py' \(0 matches\)"):
        run(tools["Edit"], file_path="src/pkg/a.py", old_string="return 99", new_string="x")
    with pytest.raises(ValueError, match="old_string is empty"):
        run(tools["Edit"], file_path="src/pkg/a.py", old_string="", new_string="x")
    with pytest.raises(ValueError, match="identical"):
        run(tools["Edit"], file_path="src/pkg/a.py", old_string="os", new_string="os")
    with pytest.raises(ValueError, match="file not found"):
        run(tools["Edit"], file_path="nope.py", old_string="a", new_string="b")
    (ws / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="not valid UTF-8"):
        run(tools["Edit"], file_path="latin1.txt", old_string="caf", new_string="tea")
    assert (ws / "latin1.txt").read_bytes() == b"caf\xe9"


# --- Glob ----------------------------------------------------------------------------------------


def test_glob(ws: Path, tools: dict[str, Tool]) -> None:
    assert run(tools["Glob"], pattern="**/*.py") == "src/pkg/a.py\nsrc/pkg/b.py"
    assert run(tools["Glob"], pattern="*.md") == "README.md"
    assert run(tools["Glob"], pattern="*.py", path="src/pkg") == "src/pkg/a.py\nsrc/pkg/b.py"
    assert run(tools["Glob"], pattern="src/*") == "src/main.ts\nsrc/pkg/"
    assert run(tools["Glob"], pattern="**/*.{ts,md}") == "README.md\nsrc/main.ts"
    assert run(tools["Glob"], pattern="src/**") == "src/\nsrc/main.ts\nsrc/pkg/\nsrc/pkg/a.py\nsrc/pkg/b.py"
    assert run(tools["Glob"], pattern="**/[ab].py") == "src/pkg/a.py\nsrc/pkg/b.py"
    assert run(tools["Glob"], pattern="**/*.rs").startswith("No files match")
    # Skipped directories are still searchable when asked for explicitly.
    assert run(tools["Glob"], pattern="**/*.py", path="node_modules") == "node_modules/dep/index.py"


def test_glob_caps_results(ws: Path) -> None:
    from tether.tools.builtin._files import glob_tool

    for i in range(30):
        (ws / f"f{i:02}.txt").write_text("x")
    out = run(glob_tool(ws, max_results=10), pattern="*.txt").splitlines()
    assert out[:10] == [f"f{i:02}.txt" for i in range(10)]
    assert out[10] == "[20 more not shown; use a narrower pattern or path]"


def test_glob_refuses_escaping_patterns(tools: dict[str, Tool]) -> None:
    with pytest.raises(ValueError, match=r"must not contain '\.\.'"):
        run(tools["Glob"], pattern="../*")
    with pytest.raises(ValueError, match="must be relative"):
        run(tools["Glob"], pattern="/etc/*")
    with pytest.raises(ValueError, match="is a file"):
        run(tools["Glob"], pattern="*", path="README.md")


def test_glob_pattern() -> None:
    assert GlobPattern("**/*.py").match("a.py") and GlobPattern("**/*.py").match("x/y/a.py")
    assert not GlobPattern("*.py").match("x/a.py")
    assert GlobPattern("a?c").match("abc") and not GlobPattern("a?c").match("a/c")
    assert GlobPattern("[!a]*").match("b.txt") and not GlobPattern("[!a]*").match("a.txt")
    assert GlobPattern("{a,b{c,d}}.txt").match("bd.txt")
    assert GlobPattern("a+b(1).txt").match("a+b(1).txt")
    assert GlobPattern("src/**/test_*.py").match("src/test_x.py")
    assert GlobPattern("src/**/test_*.py").match("src/a/b/test_x.py")
    assert not GlobPattern("src/**/test_*.py").match("lib/a/test_x.py")
    assert GlobPattern("*.py").max_depth == 1 and GlobPattern("a/{b,c/d}/*").max_depth == 4
    assert GlobPattern("**/x").max_depth is None
    with pytest.raises(ValueError, match="more than 64 alternatives"):
        GlobPattern("{a,b}" * 7)


def test_glob_pattern_does_not_backtrack_catastrophically() -> None:
    # A naive translation of this pattern takes exponential time on a long non-matching name.
    pattern = GlobPattern("*a*a*a*a*a*a*a*a*a*a*b")
    assert not pattern.match("a" * 250)
    deep = GlobPattern("**/a/**/a/**/a/**/a/**/b")
    assert not deep.match("/".join(["a"] * 60))


@settings(max_examples=300, deadline=2000)
@given(st.text(alphabet="ab*?[]!^-{},/.\\", max_size=30), st.text(alphabet="ab/.[]-", max_size=30))
def test_glob_pattern_only_value_errors(pattern: str, path: str) -> None:
    try:
        matcher = GlobPattern(pattern)
    except ValueError:
        return
    assert isinstance(matcher.match(path), bool)


# --- Grep ----------------------------------------------------------------------------------------


def test_grep(ws: Path, tools: dict[str, Tool]) -> None:
    assert run(tools["Grep"], pattern=r"def \w+") == "src/pkg/a.py:3:def alpha():\nsrc/pkg/b.py:1:def beta():"
    assert run(tools["Grep"], pattern="(?i)todo") == "src/pkg/b.py:2:    return 'TODO'"
    assert run(tools["Grep"], pattern="def", path="src/pkg/b.py") == "src/pkg/b.py:1:def beta():"
    assert run(tools["Grep"], pattern=".", glob="*.ts") == "src/main.ts:1:const x = 1;"
    assert run(tools["Grep"], pattern="def", path="src", glob="pkg/a*") == "src/pkg/a.py:3:def alpha():"
    assert run(tools["Grep"], pattern="nothing-here").startswith("No matches")
    # node_modules skipped by default, searchable on request; binary files skipped.
    assert "node_modules" not in run(tools["Grep"], pattern="alpha")
    assert "blob.bin" not in run(tools["Grep"], pattern="alpha")
    assert run(tools["Grep"], pattern="alpha", path="node_modules").startswith("node_modules/dep/index.py:1:")


def test_grep_caps_and_truncates(ws: Path) -> None:
    from tether.tools.builtin._files import grep_tool

    (ws / "many.txt").write_text("hit\n" * 50 + "hit " + "z" * 1000 + "\n")
    lines = run(grep_tool(ws, max_matches=5), pattern="hit", path="many.txt").splitlines()
    assert lines[:5] == [
        "many.txt:1:hit",
        "many.txt:2:hit",
        "many.txt:3:hit",
        "many.txt:4:hit",
        "many.txt:5:hit",
    ]
    assert lines[5].startswith("[stopped at 5 matches")
    last = run(grep_tool(ws), pattern="z{10}", path="many.txt")
    assert last.startswith("many.txt:51:hit zzz") and last.endswith("...") and len(last) < 400


def test_grep_bad_regex(tools: dict[str, Tool]) -> None:
    with pytest.raises(ValueError, match="invalid regular expression"):
        run(tools["Grep"], pattern="(unclosed")
    with pytest.raises(ValueError, match="path not found"):
        run(tools["Grep"], pattern="x", path="nope")


# --- confinement ---------------------------------------------------------------------------------


ESCAPES = ["../outside/secret.txt", "src/../../outside/secret.txt", "../../../../../etc/passwd"]


@pytest.mark.parametrize("path", ESCAPES)
def test_dotdot_escapes_refused(ws: Path, outside: Path, tools: dict[str, Tool], path: str) -> None:
    for name, args in [
        ("Read", {"file_path": path}),
        ("Write", {"file_path": path, "content": "pwned"}),
        ("Edit", {"file_path": path, "old_string": "TOP", "new_string": "X"}),
        ("Grep", {"pattern": "SECRET", "path": path}),
        ("Glob", {"pattern": "*", "path": path}),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"outside the workspace root {ws}")):
            run(tools[name], **args)
    assert (outside / "secret.txt").read_text() == "TOP SECRET def alpha\n"


def test_absolute_path_outside_refused(ws: Path, outside: Path, tools: dict[str, Tool]) -> None:
    target = str(outside / "secret.txt")
    with pytest.raises(ValueError, match="outside the workspace root"):
        run(tools["Read"], file_path=target)
    with pytest.raises(ValueError, match="outside the workspace root"):
        run(tools["Write"], file_path=str(outside / "new.txt"), content="x")
    assert not (outside / "new.txt").exists()


def test_inner_dotdot_that_stays_inside_is_fine(ws: Path, tools: dict[str, Tool]) -> None:
    assert run(tools["Read"], file_path="src/pkg/../../README.md") == "# Title\nSome text\n"


def test_symlinked_file_to_outside_refused(ws: Path, outside: Path, tools: dict[str, Tool]) -> None:
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    for name, args in [
        ("Read", {"file_path": "link.txt"}),
        ("Write", {"file_path": "link.txt", "content": "pwned"}),
        ("Edit", {"file_path": "link.txt", "old_string": "TOP", "new_string": "X"}),
        ("Grep", {"pattern": "SECRET", "path": "link.txt"}),
    ]:
        with pytest.raises(ValueError, match="through a symbolic link"):
            run(tools[name], **args)
    assert (outside / "secret.txt").read_text() == "TOP SECRET def alpha\n"
    # Walks skip it too: it neither shows up in Glob nor leaks through Grep.
    assert "link.txt" not in run(tools["Glob"], pattern="*")
    assert run(tools["Grep"], pattern="SECRET").startswith("No matches")


def test_symlinked_dir_to_outside_refused(ws: Path, outside: Path, tools: dict[str, Tool]) -> None:
    (ws / "src" / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="through a symbolic link"):
        run(tools["Read"], file_path="src/out/secret.txt")
    with pytest.raises(ValueError, match="through a symbolic link"):
        run(tools["Write"], file_path="src/out/planted.txt", content="x")
    with pytest.raises(ValueError, match="through a symbolic link"):
        run(tools["Glob"], pattern="*", path="src/out")
    with pytest.raises(ValueError, match="through a symbolic link"):
        run(tools["Grep"], pattern="SECRET", path="src/out")
    assert not (outside / "planted.txt").exists()
    assert "src/out" not in run(tools["Glob"], pattern="**/*")
    assert run(tools["Grep"], pattern="SECRET").startswith("No matches")


def test_dangling_symlink_to_outside_refused_for_write(
    ws: Path, outside: Path, tools: dict[str, Tool]
) -> None:
    (ws / "dangling").symlink_to(outside / "not-yet.txt")
    with pytest.raises(ValueError, match="through a symbolic link"):
        run(tools["Write"], file_path="dangling", content="x")
    assert not (outside / "not-yet.txt").exists()


def test_symlinks_inside_root_are_not_followed_either(ws: Path, tools: dict[str, Tool]) -> None:
    """The kernel refuses every symbolic link on the way (RESOLVE_NO_SYMLINKS / O_NOFOLLOW), so a link
    that points inside now cannot be swapped for one that points outside between a check and the open."""
    (ws / "alias.md").symlink_to(ws / "README.md")
    (ws / "pkglink").symlink_to(ws / "src" / "pkg", target_is_directory=True)
    with pytest.raises(ValueError, match=r"through a symbolic link.*target path"):
        run(tools["Read"], file_path="alias.md")
    with pytest.raises(ValueError, match="through a symbolic link"):
        run(tools["Read"], file_path="pkglink/b.py")
    listing = run(tools["Glob"], pattern="*").splitlines()
    assert "alias.md" not in listing and "pkglink/" not in listing
    assert run(tools["Read"], file_path="src/pkg/b.py").startswith("def beta")


def test_root_given_through_a_symlink(tmp_path: Path, ws: Path) -> None:
    link_root = tmp_path / "ws-link"
    link_root.symlink_to(ws, target_is_directory=True)
    tools = {t.name: t for t in file_tools(link_root)}
    # Absolute paths spelled with the symlinked root work; so do the real ones.
    assert run(tools["Read"], file_path=str(link_root / "README.md")) == "# Title\nSome text\n"
    assert run(tools["Read"], file_path=str(ws / "README.md")) == "# Title\nSome text\n"
    assert Workspace(link_root).root == ws.resolve()


def test_nul_in_path_refused(tools: dict[str, Tool]) -> None:
    with pytest.raises(ValueError, match="NUL"):
        run(tools["Read"], file_path="README.md\x00.txt")


def test_walk_does_not_follow_symlink_loops(ws: Path, tools: dict[str, Tool]) -> None:
    os.symlink(ws, ws / "src" / "loop", target_is_directory=True)
    out = run(tools["Glob"], pattern="**/*.py")
    assert out == "src/pkg/a.py\nsrc/pkg/b.py"


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.sampled_from(["..", ".", "src", "pkg", "out", "link", "a.py", "", "~", "x\\y"]),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_paths_never_leave_the_root(ws: Path, outside: Path, parts: list[str], absolute: bool) -> None:
    """Any mix of '..', symlinks in and out, relative or absolute: Read returns a file inside the real
    root, or says why not (naming the root)."""
    if not (ws / "out").is_symlink():
        (ws / "out").symlink_to(outside, target_is_directory=True)
        (ws / "src" / "link").symlink_to(ws / "src" / "pkg", target_is_directory=True)
        (outside / "a.py").write_text("OUTSIDE\n")
    read = read_tool(ws)
    path = "/".join(parts)
    if absolute:
        path = str(ws) + "/" + path
    try:
        rel = Workspace(ws).relative(path)
        text = run(read, file_path=path)
    except ValueError as exc:
        assert str(ws) in str(exc) or "empty" in str(exc) or "directory" in str(exc) or "file, not" in str(exc)
        return
    assert "OUTSIDE" not in text
    assert (ws / rel).read_text() == text and not os.path.islink(ws / rel)
