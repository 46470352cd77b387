"""The file tools against hostile input: a catastrophic regex, a huge sparse line, a FIFO, a device,
a socket. Anything that could hang runs in a child process under a generous outer timeout that only
catches the hang; memory is the child's own ru_maxrss, compared with its value before the call."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call
from hang import HANG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.tools import _beneath
from tether.tools._base import Tool
from tether.tools.builtin import file_tools
from tether.tools.builtin._files import grep_tool, read_tool
from tether.tools.builtin._regex import compile_pattern

EVIL_LINE = "a" * 40 + "!"  # 41 characters: ^(a+)+$ backtracks 2**40 times in Python's re
SPARSE_BYTES = 1_500_000_000
MEMORY_CEILING = 300 << 20


def run(tool: Tool, **args: Any) -> Any:
    return tool.fn(**tool.validator.validate(args))


def child(code: str, *, timeout: float = HANG) -> Any:
    """Run `code` in a fresh Python (its last line prints JSON) and return what it printed."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    if request.param == "openat2":
        monkeypatch.setattr(_beneath, "use_openat2", None)
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            if not _beneath.openat2_available(fd):
                pytest.skip("this kernel has no openat2 (the descriptor walk is tested instead)")
        finally:
            os.close(fd)
    else:
        monkeypatch.setattr(_beneath, "use_openat2", False)
    return request.param


@pytest.fixture
def sparse(tmp_path: Path) -> Iterator[Path]:
    """A workspace holding a 1.5 GB sparse file: 9,000 bytes of text, then zeros, no newline."""
    ws = tmp_path / "ws"
    ws.mkdir()
    big = ws / "big.log"
    big.write_bytes(b"x" * 9_000)
    os.truncate(big, SPARSE_BYTES)
    (ws / "small.txt").write_text("needle\n")
    yield ws
    big.unlink()


# --- Grep: a linear-time engine ------------------------------------------------------------------


def test_a_catastrophic_regex_returns(tmp_path: Path) -> None:
    (tmp_path / "evil.txt").write_text(EVIL_LINE + "\n" + "a" * 40 + "\n")
    got = child(f"""
        import json
        from tether.tools.builtin._files import grep_tool
        grep = grep_tool({str(tmp_path)!r})
        print(json.dumps([grep.fn(pattern="^(a+)+$"), grep.fn(pattern="(x+x+)+y")]))
    """)
    assert got == ["evil.txt:2:" + "a" * 40, "No matches for '(x+x+)+y' in ."]


def test_python_syntax_that_re2_runs(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def load_tool(x):\n    return 'TODO: Café'\nx = 42  \r\nend\n")
    grep = grep_tool(tmp_path)
    assert run(grep, pattern=r"(?i)todo") == "a.py:2:    return 'TODO: Café'"
    assert run(grep, pattern=r"def \w+_tool\(") == "a.py:1:def load_tool(x):"
    assert run(grep, pattern=r"^\s*x = \d+\s*$") == "a.py:3:x = 42  "  # a CRLF line's $ is before the \r
    assert run(grep, pattern=r"(?i)CAFÉ'$") == "a.py:2:    return 'TODO: Café'"
    assert run(grep, pattern=r"Caf\u00e9") == "a.py:2:    return 'TODO: Café'"  # Python's \u escape
    assert run(grep, pattern=r"end\Z") == "a.py:4:end"  # Python's \Z is RE2's \z
    assert run(grep, pattern=r"(?P<word>[[:alpha:]]+)\(x\)") == "a.py:1:def load_tool(x):"
    assert run(grep, pattern=r"\p{L}+é") == "a.py:2:    return 'TODO: Café'"


@pytest.mark.parametrize(("pattern", "said"), [
    (r"(\w+) \1", r"backreferences .* not supported"),
    (r"(?P<q>')x(?P=q)", r"backreferences .* not supported"),
    (r"foo(?!bar)", r"lookahead and lookbehind .* not supported.*'foo' for 'foo\(\?!bar\)'"),
    (r"(?<=def )\w+", r"lookahead and lookbehind .* not supported"),
    (r"(?>a+)b", r"atomic groups .* not supported nor needed"),
    (r"a{2000}", r"too large for RE2"),
    (r"(unclosed", r"invalid regular expression '\(unclosed': missing \).*RE2 syntax"),
])
def test_what_re2_lacks_is_one_clear_error(tmp_path: Path, pattern: str, said: str) -> None:
    (tmp_path / "a.txt").write_text("foo foo\n")
    with pytest.raises(ValueError, match=said):
        run(grep_tool(tmp_path), pattern=pattern)


def test_the_grep_description_says_re2(tmp_path: Path) -> None:
    grep = grep_tool(tmp_path)
    assert "RE2" in grep.description and "lookaround" in grep.description
    assert "Python regular expression" not in json.dumps(grep.parameters)


# --- Grep: ceilings -------------------------------------------------------------------------------


def test_grep_stops_at_its_deadline_and_says_so(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text("needle\n")
    out = run(grep_tool(tmp_path, max_seconds=0), pattern="needle")
    assert out.startswith("No matches for 'needle' in .\n[stopped early after searching 0 file(s), because it ran "
                          "for its ceiling of 0 seconds")


def test_grep_stops_at_its_byte_ceiling_and_says_so(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}.txt").write_text(f"needle {i}\n" + "x" * 90 + "\n")
    out = run(grep_tool(tmp_path, max_scan_bytes=250), pattern="needle").splitlines()
    assert out[:2] == ["f0.txt:1:needle 0", "f1.txt:1:needle 1"]
    assert out[2].startswith("[stopped early after searching 2 file(s), because the next file would pass its "
                             "ceiling of 250 bytes read")


def test_grep_names_the_files_too_big_to_search(sparse: Path) -> None:
    out = run(grep_tool(sparse), pattern="needle|xxx")
    assert out.splitlines() == [
        "small.txt:1:needle",
        "[not searched: 1 file(s) over 5,000,000 bytes ('big.log'); Read them in parts with offset and limit]",
    ]


# --- Read: a bounded slice of a line --------------------------------------------------------------


def test_a_huge_sparse_line_holds_the_memory_ceiling_and_is_told_truthfully(sparse: Path) -> None:
    got = child(f"""
        import json, resource
        from tether.tools.builtin._files import read_tool, grep_tool
        read, grep = read_tool({str(sparse)!r}), grep_tool({str(sparse)!r})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        said = []
        for args in ({{"offset": 1, "limit": 2}}, {{"offset": 2, "limit": 2}}, {{}}):
            try:
                said.append(read.fn(file_path="big.log", **args))
            except ValueError as exc:
                said.append("error: " + str(exc))
        said.append(grep.fn(pattern="x{{5}}"))
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        print(json.dumps([grew, said]))
    """)
    grew, (first, second, whole, grep) = got
    assert grew < MEMORY_CEILING, f"Read's memory grew by {grew:,} bytes"
    assert first == "error: 'big.log' looks like a binary file (it contains NUL bytes on line 1); only text files " \
        "can be read"
    assert second.startswith("error: offset 2 is out of Read's reach in 'big.log' (1,500,000,000 bytes): Read "
                             "stopped after 0 whole lines and 268,435,456 bytes because it read its ceiling")
    assert "past the end" not in first + second
    assert whole.startswith("error: 'big.log' is 1,500,000,000 bytes, over the 5,000,000-byte limit")
    assert grep.startswith("No matches for 'x{5}' in .\n[not searched: 1 file(s) over 5,000,000 bytes ('big.log')")


def test_a_long_text_line_is_cut_with_a_note_and_memory_stays_bounded(tmp_path: Path) -> None:
    (tmp_path / "min.js").write_bytes(b"a" * (64 << 20) + b"\nsecond\n")
    got = child(f"""
        import json, resource
        from tether.tools.builtin._files import read_tool
        read = read_tool({str(tmp_path)!r})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out = read.fn(file_path="min.js", offset=1, limit=2)
        print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before, out]))
    """)
    grew, out = got
    assert grew < 48 << 20, f"Read's memory grew by {grew:,} bytes for a 64 MiB line"  # it held the line
    assert out == "a" * 20_000 + "\n[line 1 cut: 20,000 of its 67,108,865 bytes shown]\nsecond\n"


def test_read_paging_through_cut_lines_and_its_scan_ceiling(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("short\n" + "é" * 30 + "\n" + "".join(f"line {i}\n" for i in range(3, 101)))
    read = read_tool(tmp_path, max_line_bytes=9, max_scan_bytes=200)
    # é is two bytes: a cut never splits one
    assert run(read, file_path="f.txt", offset=1, limit=3) == (
        "short\n" + "é" * 4 + "\n[line 2 cut: 9 of its 61 bytes shown]\nline 3\n"
        "[lines 1-3 shown; more follow: continue with offset=4]")
    with pytest.raises(ValueError, match=r"offset 90 is out of Read's reach in 'f\.txt' \(845 bytes\): Read stopped "
                       r"after 19 whole lines and 200 bytes because it read its ceiling of 200 bytes"):
        run(read, file_path="f.txt", offset=90)
    # the ceiling falls inside line 20: what was read of it is shown, and why it stops there
    assert run(read, file_path="f.txt", offset=18, limit=10) == (
        "line 18\nline 19\nline\n[line 20 cut: 4 bytes shown; Read passed 4 bytes of it and stopped before its "
        "end because it read its ceiling of 200 bytes]\n[lines 18-20 shown; no more can be read in one call]")
    # ... and at the end of line 2
    assert run(read_tool(tmp_path, max_line_bytes=9, max_scan_bytes=67), file_path="f.txt", offset=2) == (
        "é" * 4 + "\n[line 2 cut: 9 of its 61 bytes shown]\n[lines 2-2 shown; Read stopped there because it read "
        "its ceiling of 67 bytes; the lines after may be out of its reach]")
    with pytest.raises(ValueError, match=r"offset 200 is past the end of 'f\.txt', which has 100 lines"):
        run(read_tool(tmp_path), file_path="f.txt", offset=200)
    with pytest.raises(ValueError, match=r"Read stopped before line 1 of 'f\.txt' because it ran for its ceiling "
                       r"of 0 seconds"):
        run(read_tool(tmp_path, max_seconds=0), file_path="f.txt", offset=1, limit=1)


# --- FIFOs, devices, sockets ---------------------------------------------------------------------


def test_fifo_device_and_socket_fail_at_once(tmp_path: Path, resolver: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ok.txt").write_text("needle\n")
    os.mkfifo(ws / "pipe")
    kinds = {"pipe": "a FIFO (named pipe)", "sock": "a socket"}
    try:
        os.mknod(ws / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        kinds["zero"] = "a character device"
    except PermissionError:
        pass  # no CAP_MKNOD here: the FIFO and the socket still run
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(ws / "sock"))
    try:
        got = child(f"""
            import json
            from tether.tools import _beneath
            from tether.tools.builtin import file_tools
            _beneath.use_openat2 = {None if resolver == "openat2" else False}
            tools = {{t.name: t for t in file_tools({str(ws)!r})}}
            said = {{}}
            for name in {sorted(kinds)!r}:
                for tool, args in [("Read", {{}}), ("Read", {{"offset": 1}}), ("Grep", {{"pattern": "x", "path": name}}),
                                   ("Edit", {{"old_string": "a", "new_string": "b"}})]:
                    if tool != "Grep":
                        args = dict(args, file_path=name)
                    try:
                        said[f"{{tool}} {{name}} {{sorted(args)}}"] = tools[tool].fn(**args)
                    except ValueError as exc:
                        said[f"{{tool}} {{name}} {{sorted(args)}}"] = "error: " + str(exc)
            said["walk"] = tools["Grep"].fn(pattern="needle|x")
            print(json.dumps(said))
        """)
    finally:
        server.close()
    assert got.pop("walk") == "ok.txt:1:needle"  # the others were passed over, not opened
    assert len(got) == 4 * len(kinds)
    for key, said in got.items():
        name = key.split()[1]
        assert said.startswith("error: cannot ") and f"it is {kinds[name]}, not a regular file" in said, (key, said)


def test_the_tools_still_refuse_a_directory_and_a_symbolic_link(tmp_path: Path, resolver: str) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f.txt").write_text("x\n")
    (tmp_path / "link").symlink_to(tmp_path / "f.txt")
    tools = {t.name: t for t in file_tools(tmp_path)}
    with pytest.raises(ValueError, match="is a directory"):
        run(tools["Read"], file_path="d", offset=1)
    with pytest.raises(ValueError, match="symbolic link"):
        run(tools["Read"], file_path="link")
    with pytest.raises(ValueError, match="symbolic link"):
        run(tools["Grep"], pattern="x", path="link")
    assert run(tools["Grep"], pattern="x", path="d").startswith("No matches")


# --- through the CLI: the run's own deadline ------------------------------------------------------


def test_the_issue_through_the_cli_holds_the_run_deadline(sparse: Path) -> None:
    (sparse / "evil.txt").write_text(EVIL_LINE + "\n")
    calls = [tool_call("Grep", {"pattern": "^(a+)+$"}, id="grep"),
             tool_call("Read", {"file_path": "big.log", "offset": 1, "limit": 2}, id="read")]
    script = [chat_completion(None, calls), chat_completion("done")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_"))}
    with FakeOpenAIServer(script) as server:
        env.update(OPENROUTER_API_KEY="sk-test", OPENROUTER_BASE_URL=server.base_url)
        proc = subprocess.run([sys.executable, "-m", "tether.cli", "-p", "look around", "--workspace", str(sparse),
                               "--tools", "files", "--max-seconds", "20"], cwd=sparse.parent, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG * 2)
        bodies = [r.body for r in server.requests]
    assert proc.returncode == 0, proc.stderr
    results = {m.get("tool_call_id"): m.get("content", "") for m in bodies[1]["messages"] if m["role"] == "tool"}
    assert "No matches for '^(a+)+$'" in results["grep"], results
    assert "not searched: 1 file(s) over 5,000,000 bytes ('big.log')" in results["grep"]
    assert "binary file (it contains NUL bytes on line 1)" in results["read"], results


# --- Grep's whole-text pass finds exactly the lines a line-by-line search finds ---------------------

TOKENS = ["^", "$", "a", "b", " ", ".", "\\b", "\\B", "\\s", "\\S", "[^a]", "a*", "b+?", "(a|^b)", "(?i)A", "\\A",
          "\\z", "(?s).", "(?-m)^a", "\\n", "(?m)$"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=4),
       text=st.text(alphabet="ab \n\r", max_size=40))
def test_the_whole_text_pass_agrees_with_line_by_line(tokens: list[str], text: str) -> None:
    try:
        pattern = compile_pattern("".join(tokens))
    except ValueError:
        return
    data = text.encode()
    slow = list(pattern._each_line(data, lambda: True))
    assert list(pattern.lines(data, lambda: True)) == slow
    assert list(pattern.lines(data.replace(b"\r", b""), lambda: True)) == list(
        pattern._each_line(data.replace(b"\r", b""), lambda: True))
