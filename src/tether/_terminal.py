"""Everything tether writes to a terminal goes through here: one sanitiser, one way to show a call.

A model's answer, a tool's arguments, an indexed document, an MCP server's tool list or a
provider's error can hold what a terminal obeys or hides: escape sequences (CSI cursor moves and
erases, OSC 8 links that lie about their target, OSC 52 clipboard writes, OSC 0 titles, DCS/APC
strings), 8-bit C1 controls, C0 controls such as carriage return or backspace that overwrite what
was shown, and invisible characters (bidi overrides that reorder text, zero-width characters, Unicode
tag characters that carry hidden text). `clean` removes every control and every character of the
Unicode categories Cc, Cf, Cs, Zl and Zp (tab and newline kept): an allowlist by category, so a
format character nobody listed is removed too. `--raw` turns it off for an answer.

`show_value` and `show_call` are for approval prompts, where hiding nothing matters more than
reading well: every character that is not plainly visible is written as an escape, long runs of
whitespace are collapsed with their length stated, and a long value is cut in the middle, so the
start and the end of every argument stay on screen.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, TextIO

_ESCAPE_SEQUENCE = re.compile(
    r"""
      \x1b\[[0-?]*[ -/]*[@-~]?                      # CSI ... final byte
    | \x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?   # OSC (0: title, 8: links, 52: clipboard) ... BEL or ST
    | \x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?        # DCS, SOS, PM, APC strings ... ST
    | \x1b[ -/]*[0-~]?                              # any other escape sequence (charset, keypad, RIS ...)
    | \x9b[0-?]*[ -/]*[@-~]?                        # 8-bit CSI
    | \x9d[^\x07\x9c]*(?:\x07|\x9c)?                # 8-bit OSC
    | [\x90\x98\x9e\x9f][^\x9c]*\x9c?               # 8-bit DCS, SOS, PM, APC
    """,
    re.VERBOSE,
)
# Every code point of categories Cc, Cf, Cs, Zl, Zp but tab and newline (Unicode 14, Python 3.11;
# tests/test_terminal.py checks this against the running Python's unicodedata), and the whole tag block.
INVISIBLE_RANGES = (
    (0x0, 0x8), (0xB, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD),
    (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x2028, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xD800, 0xDFFF), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE007F),
)
_INVISIBLE = re.compile("[" + "".join(
    re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in INVISIBLE_RANGES) + "]")
_C1 = re.compile(r"[\x7f-\x9f]")
_WHITESPACE_RUN = re.compile(r"\s{8,}")


def clean(text: str) -> str:
    """`text` without terminal escape sequences, controls and invisible characters (tab and newline
    are kept)."""
    if _INVISIBLE.search(text) is None:  # the common case costs one scan
        return text
    return _INVISIBLE.sub("", _ESCAPE_SEQUENCE.sub("", text))


def json_safe(text: str) -> str:
    """JSON text with DEL and C1 controls written as \\u escapes (JSON escapes C0 itself): the same
    data, nothing a terminal obeys. These characters only occur inside JSON strings."""
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _escape_char(ch: str) -> str:
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\\":
        return "\\\\"
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def show_value(text: str, *, limit: int = 240) -> str:
    """`text` for a person to judge, on one line: every character that is not plainly visible
    (controls, format and invisible characters, unassigned and private-use ones, any whitespace but
    the space) escaped as \\n, \\t or \\uXXXX, each run of 8+ whitespace characters shown as
    `⟨N whitespace⟩`, and, past `limit` characters, cut in the middle with the number of the
    original's characters cut stated."""
    parts: list[tuple[bool, str]] = []  # (is a collapsed run, text)
    pos = 0
    for run in _WHITESPACE_RUN.finditer(text):
        if run.start() > pos:
            parts.append((False, text[pos:run.start()]))
        parts.append((True, run.group()))
        pos = run.end()
    if pos < len(text):
        parts.append((False, text[pos:]))
    shown = _take(parts, limit + 1)
    if sum(len(p) for p, _ in shown) <= limit and sum(n for _, n in shown) == len(text):
        return "".join(p for p, _ in shown)
    head = _take(parts, limit // 2)
    tail = _take([(run, seg[::-1]) for run, seg in reversed(parts)], limit // 2)  # from the end
    cut = len(text) - sum(n for _, n in head) - sum(n for _, n in tail)
    return ("".join(p for p, _ in head) + f"⟨…{cut} characters cut…⟩"
            + "".join(p for p, _ in reversed(tail)))


def _take(parts: list[tuple[bool, str]], width: int) -> list[tuple[str, int]]:
    """Shown pieces (and how many original characters each stands for) from the start of `parts`
    while they fit in `width`."""
    out: list[tuple[str, int]] = []
    used = 0
    for is_run, seg in parts:
        pieces = [(f"⟨{len(seg)} whitespace⟩", len(seg))] if is_run else ((_shown_char(ch), 1) for ch in seg)
        for piece, n in pieces:
            if used + len(piece) > width:
                return out
            out.append((piece, n))
            used += len(piece)
    return out


def _shown_char(ch: str) -> str:
    if ch == " " or (ch != "\\" and unicodedata.category(ch)[0] not in "CZ"):
        return ch
    return _escape_char(ch)


def show_call(tool: str, arguments: Mapping[str, Any] | Any, *, limit: int = 240) -> list[str]:
    """The lines that show one tool call: `tool: NAME`, then one `  name = value` line per argument
    (strings quoted, other values as JSON), each through `show_value`."""
    lines = [f"  tool: {show_value(str(tool), limit=limit)}"]
    items = arguments.items() if isinstance(arguments, Mapping) else [("(arguments)", arguments)]
    for key, value in items:
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True,
                                                                 default=str)
        quote = '"' if isinstance(value, str) else ""
        lines.append(f"    {show_value(str(key), limit=60)} = {quote}{show_value(shown, limit=limit)}{quote}")
    return lines


def show_approval(req: Any, *, max_dry_run_lines: int = 20) -> str:
    """An approval question (a `tether.policy.ApprovalRequest`) as terminal text in which nothing is
    hidden, reordered or pushed off screen: every line through `show_value`."""
    lines = [f"Approval needed ({show_value(str(req.effect), limit=40)}): {show_value(str(req.description))}",
             *show_call(req.tool, req.arguments),
             f"  why: {show_value(str(req.reason), limit=400)}"]
    risky = {p: o for p, o in req.provenance.items() if o in ("untrusted", "model")}
    if risky:
        lines.append("  not from your request: " + show_value(
            ", ".join(f"{p or 'value'} ({o})" for p, o in risky.items()), limit=400))
    if req.dry_run:
        dry = str(req.dry_run).splitlines() or [""]
        lines.append("  dry run:")
        lines += [f"    {show_value(line)}" for line in dry[:max_dry_run_lines]]
        if len(dry) > max_dry_run_lines:
            lines.append(f"    ⟨{len(dry) - max_dry_run_lines} more lines⟩")
    return "\n".join(lines)


def flush_typeahead(stream: TextIO) -> None:
    """Drop what was typed on the terminal `stream` before a question was shown, so a key pressed
    earlier (a `y` typed ahead) cannot answer it. Nothing happens when it is not a terminal."""
    try:
        if stream.isatty():
            import termios

            termios.tcflush(stream.fileno(), termios.TCIFLUSH)
    except (OSError, ValueError, ImportError, AttributeError):
        pass


class CleanWriter:
    """A text stream that writes `clean(text)` to another one (for prompts written by other code)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(clean(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()


__all__ = ["INVISIBLE_RANGES", "CleanWriter", "clean", "flush_typeahead", "json_safe", "show_approval", "show_call",
           "show_value"]
