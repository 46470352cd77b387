"""A JSON Schema `pattern` as a GBNF rule for the body of a JSON string.

The subset tools use: literals, escaped literals, `.`, character classes (ranges, negation,
`\\d \\w \\s` and their negations), groups (`(...)`, `(?:...)`), alternation, the quantifiers
`* + ? {m} {m,} {m,n}` (a lazy `?` suffix is ignored), and `^`/`$` at the ends. Anything else
(look-around, back-references, `\\b`, flags) raises `GrammarError`.

The translation is sound, not complete: every string the rule accepts, JSON-decoded, is matched
by `re.search(pattern, s)`; some matching strings are left out on purpose. Control characters
never appear, negated classes and negated shorthands stay within printable ASCII (Python's `\\D`
excludes non-ASCII digits too), `\\d`/`\\w` mean their ASCII forms, unbounded quantifiers are
capped, and an unanchored end is padded with printable ASCII.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tether._errors import TetherError

Ranges = tuple[tuple[int, int], ...]

PRINTABLE: Ranges = ((0x20, 0x7E),)
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE: Ranges = ((0x20, 0x20),)
_QUOTE, _BACKSLASH = 0x22, 0x5C
_ESCAPED_LITERALS = set(".^$*+?()[]{}|\\/-\"'#&~!,:;<=>@%`_ ")


class RegexError(TetherError, ValueError):
    """The pattern uses something outside the supported subset."""


@dataclass(frozen=True, slots=True)
class Chars:
    ranges: Ranges  # code points the node may match (already restricted as the docstring says)


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    node: Node
    low: int
    high: int | None  # None: unbounded


Node = Chars | Seq | Alt | Repeat


def _normalize(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] <= r[1]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _minus(ranges: Ranges, removed: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for rlo, rhi in removed:
            nxt = []
            for plo, phi in pieces:
                if rhi < plo or rlo > phi:
                    nxt.append((plo, phi))
                    continue
                if plo < rlo:
                    nxt.append((plo, rlo - 1))
                if rhi < phi:
                    nxt.append((rhi + 1, phi))
            pieces = nxt
        out += pieces
    return _normalize(out)


def _shorthand(ch: str) -> tuple[Ranges, bool]:
    """(ranges, negated) for \\d \\w \\s \\D \\W \\S."""
    table = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
    return table[ch.lower()], ch.isupper()


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def fail(self, why: str) -> RegexError:
        return RegexError(f"pattern {self.p!r}: {why} (at position {self.i})")

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def take(self) -> str:
        ch = self.peek()
        self.i += 1
        return ch

    def parse(self) -> tuple[Node, bool, bool]:
        start = self.peek() == "^"
        if start:
            self.i += 1
        end = self.p.endswith("$") and not self.p.endswith("\\$")
        body_end = len(self.p) - 1 if end else len(self.p)
        self.p, whole = self.p[:body_end], self.p
        node = self.alt()
        if self.i != len(self.p):
            self.p = whole
            raise self.fail("unbalanced ')'")
        self.p = whole
        return node, start, end

    def alt(self) -> Node:
        options = [self.seq()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.seq())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def seq(self) -> Node:
        items: list[Node] = []
        while self.peek() and self.peek() not in "|)":
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self, node: Node) -> Node:
        while True:
            ch = self.peek()
            if ch == "*":
                low, high = 0, None
            elif ch == "+":
                low, high = 1, None
            elif ch == "?":
                low, high = 0, 1
            elif ch == "{" and self._is_count():
                low, high = self._count()
                node = Repeat(node, low, high)
                self._lazy()
                continue
            else:
                return node
            self.i += 1
            node = Repeat(node, low, high)
            self._lazy()

    def _lazy(self) -> None:
        if self.peek() and self.peek() in "?+":  # lazy / possessive: same language
            self.i += 1

    def _is_count(self) -> bool:
        j = self.p.find("}", self.i)
        body = self.p[self.i + 1 : j] if j > 0 else ""
        parts = body.split(",")
        return bool(body) and len(parts) <= 2 and parts[0].isdigit() and all(p.isdigit() or p == "" for p in parts[1:])

    def _count(self) -> tuple[int, int | None]:
        j = self.p.index("}", self.i)
        body = self.p[self.i + 1 : j]
        self.i = j + 1
        if "," not in body:
            return int(body), int(body)
        lo, hi = body.split(",")
        low, high = int(lo), (int(hi) if hi else None)
        if high is not None and high < low:
            raise self.fail(f"bad count {{{body}}}")
        return low, high

    def atom(self) -> Node:
        ch = self.take()
        if ch == "(":
            if self.peek() == "?":
                if self.p[self.i : self.i + 2] != "?:":
                    raise self.fail("only (?:...) groups are supported")
                self.i += 2
            node = self.alt()
            if self.take() != ")":
                raise self.fail("missing ')'")
            return node
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return Chars((*PRINTABLE, (0xA0, 0xD7FF), (0xE000, 0x10FFFF)))  # no surrogates
        if ch == "\\":
            return self.escape()
        if ch in "^$":
            raise self.fail(f"'{ch}' is supported only at the ends")
        if ch in "*+?{":
            if ch == "{" and not self._is_count():
                return Chars(((ord(ch), ord(ch)),))
            raise self.fail(f"nothing to repeat before '{ch}'")
        return Chars(((ord(ch), ord(ch)),))

    def escape(self) -> Chars:
        ch = self.take()
        if not ch:
            raise self.fail("pattern ends with '\\'")
        if ch in "dwsDWS":
            ranges, negated = _shorthand(ch)
            return Chars(_minus(PRINTABLE, ranges) if negated else ranges)
        simple = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B}
        if ch in simple:
            return Chars(((simple[ch], simple[ch]),))
        if ch in _ESCAPED_LITERALS:
            return Chars(((ord(ch), ord(ch)),))
        raise self.fail(f"unsupported escape '\\{ch}'")

    def char_class(self) -> Chars:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            ch = self.peek()
            if not ch:
                raise self.fail("missing ']'")
            if ch == "]" and not first:
                self.i += 1
                break
            first = False
            lo_chars = self._class_item()
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                if len(lo_chars) != 1 or lo_chars[0][0] != lo_chars[0][1]:
                    raise self.fail("a range cannot start at a class shorthand")
                self.i += 1
                hi_chars = self._class_item()
                if len(hi_chars) != 1 or hi_chars[0][0] != hi_chars[0][1]:
                    raise self.fail("a range cannot end at a class shorthand")
                lo, hi = lo_chars[0][0], hi_chars[0][0]
                if hi < lo:
                    raise self.fail("bad range in a character class")
                ranges.append((lo, hi))
            else:
                ranges += list(lo_chars)
        got = _normalize(ranges)
        return Chars(_minus(PRINTABLE, got) if negated else got)

    def _class_item(self) -> Ranges:
        ch = self.take()
        if ch == "\\":
            return self.escape().ranges
        if ch == "[" and self.peek() == ":":
            raise self.fail("POSIX classes are not supported")
        return ((ord(ch), ord(ch)),)


def parse_pattern(pattern: str) -> tuple[Node, bool, bool]:
    """(tree, anchored at start, anchored at end)."""
    return _Parser(pattern).parse()


def lengths(node: Node, cap: int) -> tuple[int, float]:
    """(shortest, longest) match, with unbounded quantifiers capped at `cap` repeats."""
    if isinstance(node, Chars):
        return (1, 1) if node.ranges else (math.inf, -math.inf)  # type: ignore[return-value]
    if isinstance(node, Seq):
        lo, hi = 0, 0.0
        for item in node.items:
            a, b = lengths(item, cap)
            lo, hi = lo + a, hi + b
        return lo, hi
    if isinstance(node, Alt):
        pairs = [lengths(o, cap) for o in node.options]
        return min(p[0] for p in pairs), max(p[1] for p in pairs)
    a, b = lengths(node.node, cap)
    high = node.high if node.high is not None else max(cap, node.low)
    return a * node.low, b * high


class Emitter:
    """Writes GBNF for a parsed pattern, inside a JSON string (escaping `"` and `\\`)."""

    def __init__(self, cap: int, excludes: Ranges = ()) -> None:
        self.cap = cap
        self.excludes = excludes  # extra code points left out of classes (never out of literals)

    def emit(self, node: Node) -> str:
        if isinstance(node, Chars):
            return self.chars(node.ranges)
        if isinstance(node, Seq):
            if not node.items:
                return '""'
            parts: list[str] = []
            run = ""  # consecutive single characters become one literal
            for item in node.items:
                if isinstance(item, Chars) and len(item.ranges) == 1 and item.ranges[0][0] == item.ranges[0][1]:
                    run += chr(item.ranges[0][0])
                    continue
                if run:
                    parts.append(json_text(run))
                    run = ""
                parts.append(self.emit(item))
            if run:
                parts.append(json_text(run))
            return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"
        if isinstance(node, Alt):
            return "(" + " | ".join(self.emit(o) for o in node.options) + ")"
        item = self.emit(node.node)
        if isinstance(node.node, Repeat):
            item = f"({item})"  # GBNF takes one quantifier per item
        high = node.high if node.high is not None else max(self.cap, node.low)
        if high == 0:
            return '""'
        if node.low == high:
            return f"{item}{{{high}}}"
        return f"{item}{{{node.low},{high}}}"

    def chars(self, ranges: Ranges) -> str:
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            return json_char(chr(ranges[0][0]))  # a literal: kept even when excluded from classes
        plain = _minus(ranges, ((0, 0x1F), (0x7F, 0x7F), (_QUOTE, _QUOTE), (_BACKSLASH, _BACKSLASH), *self.excludes))
        parts = []
        if plain:
            parts.append("[" + "".join(_range(lo, hi) for lo, hi in plain) + "]")
        for special in (_QUOTE, _BACKSLASH):
            if any(lo <= special <= hi for lo, hi in ranges):
                parts.append(json_char(chr(special)))
        if not parts:
            return "[^\\x00-\\U0010FFFF]"  # matches nothing
        return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_text(text: str) -> str:
    """A GBNF literal for `text` as it is written inside a JSON string."""
    return literal(json.dumps(text)[1:-1])


json_char = json_text


def _cls(cp: int) -> str:
    ch = chr(cp)
    if ch in "\\]^-[":
        return "\\" + ch
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}"
    if cp > 0xFFFF:
        return f"\\U{cp:08X}"
    if cp > 0x7E:
        return f"\\u{cp:04X}"
    return ch


def _range(lo: int, hi: int) -> str:
    return _cls(lo) if lo == hi else f"{_cls(lo)}-{_cls(hi)}"


def pattern_body(
    pattern: str, *, min_len: int = 0, max_len: int | None = None, cap: int = 12, excludes: Ranges = ()
) -> str:
    """GBNF for the inside of a JSON string matching `pattern` within [min_len, max_len] characters.

    Unbounded quantifiers repeat at most `cap` times, lowered until the longest match fits
    `max_len`. Raises RegexError when the pattern is outside the subset or the length bounds
    cannot be guaranteed (the pattern's shortest match is below `min_len`, or even one repeat
    per quantifier is longer than `max_len`).
    """
    node, start, end = parse_pattern(pattern)
    pad = Repeat(Chars(PRINTABLE), 0, None)
    items = ([] if start else [pad]) + [node] + ([] if end else [pad])
    whole: Node = Seq(tuple(items)) if len(items) > 1 else node
    if max_len is not None:
        while cap > 1 and lengths(whole, cap)[1] > max_len:
            cap -= 1
    shortest, longest = lengths(whole, cap)
    if max_len is not None and longest > max_len:
        raise RegexError(f"pattern {pattern!r}: cannot bound its matches to {max_len} characters")
    if shortest < min_len:
        raise RegexError(f"pattern {pattern!r}: matches shorter than minLength {min_len}")
    if shortest == math.inf:
        raise RegexError(f"pattern {pattern!r}: matches nothing the grammar can write")
    return Emitter(cap, excludes).emit(whole)
