"""A GBNF recognizer and random sampler for the subset tether's grammar builder emits.

Independent of llama.cpp, so grammar tests run without it; tests that have llama.cpp also check
that it agrees.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar


class Gbnf:
    """Parses GBNF text and tells whether a string matches `root` (sets of end positions, memoised)."""

    _ESC: ClassVar[dict[str, str]] = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "]": "]", "[": "[", "-": "-", "^": "^", "/": "/"}

    def __init__(self, text: str) -> None:
        self.rules: dict[str, Any] = {}
        for line in text.strip().splitlines():
            name, body = line.split(" ::= ", 1)
            self.src, self.pos = body, 0
            self.rules[name.strip()] = self._alt()
            self._ws()
            assert self.pos == len(self.src), f"trailing text in rule {name}: {self.src[self.pos:]!r}"
        for name in self._refs():
            assert name in self.rules, f"undefined rule {name}"

    def _refs(self) -> set[str]:
        out: set[str] = set()

        def walk(node: Any) -> None:
            if node[0] == "ref":
                out.add(node[1])
            elif node[0] in ("alt", "seq"):
                for n in node[1]:
                    walk(n)
            elif node[0] == "rep":
                walk(node[1])

        for r in self.rules.values():
            walk(r)
        return out

    # parsing
    def _ws(self) -> None:
        while self.pos < len(self.src) and self.src[self.pos] == " ":
            self.pos += 1

    def _alt(self) -> Any:
        options = [self._seq()]
        while self.pos < len(self.src) and self.src[self.pos] == "|":
            self.pos += 1
            options.append(self._seq())
        return ("alt", options)

    def _seq(self) -> Any:
        items = []
        while True:
            self._ws()
            if self.pos >= len(self.src) or self.src[self.pos] in "|)":
                return ("seq", items)
            items.append(self._postfix(self._primary()))

    def _char(self) -> str:
        c = self.src[self.pos]
        if c != "\\":
            self.pos += 1
            return c
        e = self.src[self.pos + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width:
            self.pos += 2 + width
            return chr(int(self.src[self.pos - width : self.pos], 16))
        self.pos += 2
        return self._ESC[e]

    def _primary(self) -> Any:
        c = self.src[self.pos]
        if c == '"':
            self.pos += 1
            chars = []
            while self.src[self.pos] != '"':
                chars.append(self._char())
            self.pos += 1
            return ("lit", "".join(chars))
        if c == "[":
            self.pos += 1
            negate = self.src[self.pos] == "^"
            self.pos += negate
            ranges = []
            while self.src[self.pos] != "]":
                lo = self._char()
                hi = lo
                if self.src[self.pos] == "-" and self.src[self.pos + 1] != "]":
                    self.pos += 1
                    hi = self._char()
                ranges.append((lo, hi))
            self.pos += 1
            return ("cls", negate, ranges)
        if c == "(":
            self.pos += 1
            node = self._alt()
            assert self.src[self.pos] == ")"
            self.pos += 1
            return node
        m = re.compile(r"[a-zA-Z0-9-]+").match(self.src, self.pos)
        assert m, f"bad token at {self.src[self.pos:]!r}"
        self.pos = m.end()
        return ("ref", m.group())

    def _postfix(self, node: Any) -> Any:
        if self.pos < len(self.src):
            c = self.src[self.pos]
            if c in "?*+":
                self.pos += 1
                return ("rep", node, {"?": 0, "*": 0, "+": 1}[c], {"?": 1, "*": None, "+": None}[c])
            m = re.compile(r"\{(\d+)(,(\d*))?\}").match(self.src, self.pos)
            if m:
                self.pos = m.end()
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                return ("rep", node, lo, hi)
        return node

    # matching
    def matches(self, text: str, rule: str = "root") -> bool:
        memo: dict[tuple[int, int], frozenset[int]] = {}

        def ends(node: Any, i: int) -> frozenset[int]:
            key = (id(node), i)
            if key in memo:
                return memo[key]
            memo[key] = frozenset()  # no left recursion in our grammars; guards against loops
            kind = node[0]
            if kind == "lit":
                out = frozenset({i + len(node[1])}) if text.startswith(node[1], i) else frozenset()
            elif kind == "cls":
                ok = i < len(text) and any(lo <= text[i] <= hi for lo, hi in node[2]) != node[1]
                out = frozenset({i + 1}) if ok else frozenset()
            elif kind == "ref":
                out = ends(self.rules[node[1]], i)
            elif kind == "alt":
                out = frozenset().union(*(ends(n, i) for n in node[1]))
            elif kind == "seq":
                cur = frozenset({i})
                for item in node[1]:
                    cur = frozenset().union(*(ends(item, p) for p in cur))
                out = cur
            else:  # rep
                _, item, lo, hi = node
                result = {i} if lo == 0 else set()
                cur, k = frozenset({i}), 0
                while cur and (hi is None or k < hi) and k <= len(text):
                    k += 1
                    cur = frozenset().union(*(ends(item, p) for p in cur))
                    if k >= lo:
                        result |= cur
                out = frozenset(result)
            memo[key] = out
            return out

        return len(text) in ends(self.rules[rule], 0)

    # sampling
    def sample(self, rng: random.Random, rule: str = "root", *, extra: int = 3) -> str:
        """A random string of the grammar (unbounded repeats get up to `extra` more than their minimum)."""
        out: list[str] = []

        def walk(node: Any, depth: int) -> None:
            kind = node[0]
            if depth > 60:
                raise RecursionError("grammar too deep to sample")
            if kind == "lit":
                out.append(node[1])
            elif kind == "cls":
                out.append(self._pick(node, rng))
            elif kind == "ref":
                walk(self.rules[node[1]], depth + 1)
            elif kind == "alt":
                walk(rng.choice(node[1]), depth + 1)
            elif kind == "seq":
                for item in node[1]:
                    walk(item, depth + 1)
            else:
                _, item, lo, hi = node
                for _ in range(rng.randint(lo, lo + extra if hi is None else hi)):
                    walk(item, depth + 1)

        walk(self.rules[rule], 0)
        return "".join(out)

    @staticmethod
    def _pick(node: Any, rng: random.Random) -> str:
        _, negate, ranges = node
        if not negate:
            lo, hi = rng.choice(ranges)
            return chr(rng.randint(ord(lo), ord(hi)))
        pool = [chr(c) for c in range(0x20, 0x7F) if not any(lo <= chr(c) <= hi for lo, hi in ranges)]
        pool += [c for c in "éß中😀" if not any(lo <= c <= hi for lo, hi in ranges)]
        return rng.choice(pool)

