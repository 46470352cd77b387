"""Grep's patterns, run by RE2: time linear in the text searched, whatever the pattern.

Python's `re` backtracks: `^(a+)+$` against 41 `a`s and a `!` takes longer than the age of the
universe, holding the GIL all along, so no timer in the process fires. RE2 has no backreferences and
no lookaround (the features that need backtracking); a pattern using one gets one error saying what is
unsupported and what to do instead, never a fallback to `re`. Python spellings RE2 lacks but can say
another way are translated: `\\Z` (end of text) to `\\z`, `\\uXXXX` and `\\UXXXXXXXX` to `\\x{...}`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import re2

from tether._errors import InvalidInput

SYNTAX = (
    "RE2 syntax: Python's re without backreferences or lookaround; \\w, \\d, \\s and \\b are ASCII "
    "(\\p{L} is a letter in any script)"
)

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print every refused pattern on stderr
_OPTIONS.max_mem = 64 << 20  # a big pattern's automaton (RE2's default is 8 MiB)

_HEX = re.compile(r"[0-9A-Fa-f]+")

# (what RE2 says, what the model is told); the first that matches wins.
_UNSUPPORTED: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"invalid escape sequence: \\[1-9]|invalid perl operator: \(\?P$"),  # (?P=name)
     "backreferences (\\1, (?P=name)) are not supported; search for the pattern without the repeat "
     "(e.g. '(\\w+) \\w+' for '(\\w+) \\1') and check the matching lines yourself"),
    (re.compile(r"invalid perl operator: \(\?<?[=!]"),
     "lookahead and lookbehind ((?=...), (?!...), (?<=...), (?<!...)) are not supported; search for the "
     "text without them (e.g. 'foo' for 'foo(?!bar)') and judge the matching lines yourself, or run a "
     "second Grep for what must not follow"),
    (re.compile(r"invalid perl operator: \(\?>|bad repetition operator: [*+?}]\+"),
     "atomic groups and possessive quantifiers ((?>...), a*+) are not supported nor needed (RE2 never "
     "backtracks); drop the '>' or the second '+'"),
    (re.compile(r"invalid perl operator: \(\?\("),
     "conditional groups ((?(1)...)) are not supported; search for each alternative separately"),
    (re.compile(r"invalid perl operator: \(\?[aLux#]"),
     "the flags (?a), (?L), (?u), (?x) and (?#...) comments are not supported (only i, m, s and U are); "
     "write the pattern without them"),
]


class _Regexp(Protocol):
    def search(self, text: bytes, pos: int | None = None) -> Any: ...


class LinePattern:
    """A pattern searched in each line of a text. Lines end at a newline; a carriage return before it
    is not part of the line (so `$` matches before it), which numbers lines as Read does."""

    def __init__(self, line: _Regexp, text: _Regexp | None) -> None:
        self._line = line
        # The same pattern in multi-line mode over the whole text: it matches wherever a line would, so
        # the stretches where it finds nothing are passed over in one call of RE2's own loop.
        self._text = text

    def lines(self, data: bytes, go_on: Callable[[], bool]) -> Iterator[tuple[int, bytes]]:
        """(number, line) of each line of `data` that matches, while `go_on()` (asked now and then)."""
        if self._text is None or b"\r" in data:
            yield from self._each_line(data, go_on)
            return
        end = len(data)
        pos = 0  # always the start of a line
        number, counted = 1, 0
        steps = 0
        while pos < end:
            steps += 1
            if steps % 1024 == 0 and not go_on():
                return
            found = self._text.search(data, pos)
            if found is None or (found.start() == end and data.endswith(b"\n")):  # after the last line
                return
            start = data.rfind(b"\n", pos, found.start())
            start = pos if start < 0 else start + 1
            stop = data.find(b"\n", found.start())
            stop = end if stop < 0 else stop
            number += data.count(b"\n", counted, start)
            counted = start
            line = data[start:stop]
            if self._line.search(line) is not None:
                yield number, line
            pos = stop + 1

    def _each_line(self, data: bytes, go_on: Callable[[], bool]) -> Iterator[tuple[int, bytes]]:
        lines = data.split(b"\n")
        if lines[-1] == b"":  # the newline ending the last line does not start another
            lines.pop()
        for number, line in enumerate(lines, 1):
            if number % 4096 == 0 and not go_on():
                return
            if line.endswith(b"\r"):
                line = line[:-1]
            if self._line.search(line) is not None:
                yield number, line


# A whole-text search stands in for the line-by-line one only if the pattern cannot tell them apart:
# \A and \z (start and end of the text) and a flag group turning multi-line mode off can.
_TEXT_SENSITIVE = re.compile(r"\\[Az]|\(\?[A-Za-z]*-")


def translate(pattern: str) -> str:
    """`pattern` with the Python-only escapes RE2 spells differently rewritten (`\\Z`, `\\u`, `\\U`)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch != "\\" or i + 1 == len(pattern):
            out.append(ch)
            i += 1
            continue
        nxt = pattern[i + 1]
        width = {"u": 4, "U": 8}.get(nxt)
        digits = pattern[i + 2 : i + 2 + width] if width else ""
        if nxt == "Z":
            out.append("\\z")
        elif width and len(digits) == width and _HEX.fullmatch(digits):
            out.append("\\x{" + digits + "}")
            i += width
        else:
            out.append(ch + nxt)
        i += 2
    return "".join(out)


def compile_pattern(pattern: str) -> LinePattern:
    """`pattern` compiled by RE2 for searching UTF-8 bytes; InvalidInput saying what is wrong (and
    what to do instead, for a feature RE2 lacks)."""
    translated = translate(pattern)
    try:
        line = re2.compile(translated, _OPTIONS)
    except UnicodeEncodeError:
        raise InvalidInput(f"invalid regular expression {pattern!r}: it is not valid Unicode text") from None
    except re2.error as exc:
        raw = exc.args[0] if exc.args else ""
        reason = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        raise _refusal(pattern, reason) from None
    text = None if _TEXT_SENSITIVE.search(translated) else re2.compile("(?m)" + translated, _OPTIONS)
    return LinePattern(line, text)


def _refusal(pattern: str, reason: str) -> InvalidInput:
    for said, advice in _UNSUPPORTED:
        if said.search(reason):
            return InvalidInput(f"Grep cannot run {pattern!r}: it uses RE2, whose matching time is linear in "
                                f"the text, and {advice}")
    if "too large" in reason or "invalid repetition size" in reason:
        return InvalidInput(f"invalid regular expression {pattern!r}: {reason}; the pattern is too large for "
                            "RE2 (a repeat count is at most 1000): use a shorter one")
    return InvalidInput(f"invalid regular expression {pattern!r}: {reason}. Grep takes {SYNTAX}")


__all__ = ["SYNTAX", "LinePattern", "compile_pattern", "translate"]
