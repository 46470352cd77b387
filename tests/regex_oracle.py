"""Whether a Python regex matches somewhere in a text, in polynomial time: an oracle for the grammar
tests that cannot hang the way `re.search` does on nested quantifiers (catastrophic backtracking).

The pattern is parsed by Python's own parser (`re._parser`) and single characters are tested with
`re` itself, so the semantics are Python's; only the search differs: the set of positions each node
can end at from each start, memoised (like `Gbnf.matches`), instead of backtracking. The subset:
literals, classes, `.`, alternation, groups, greedy/lazy repeats, `^ $ \\A \\Z`; no backreferences or
lookarounds (the grammar builder refuses them).
"""

from __future__ import annotations

import re
import re._constants as c
import re._parser as parser
from functools import cache
from typing import Any

_CATEGORIES = {c.CATEGORY_DIGIT: r"\d", c.CATEGORY_NOT_DIGIT: r"\D", c.CATEGORY_SPACE: r"\s",
               c.CATEGORY_NOT_SPACE: r"\S", c.CATEGORY_WORD: r"\w", c.CATEGORY_NOT_WORD: r"\W"}


@cache
def _in_category(category: Any, ch: str) -> bool:
    return re.fullmatch(_CATEGORIES[category], ch) is not None


def _in_set(items: list[tuple[Any, Any]], ch: str) -> bool:
    negate, hit = False, False
    for op, av in items:
        if op is c.NEGATE:
            negate = True
        elif op is c.LITERAL:
            hit = hit or ord(ch) == av
        elif op is c.RANGE:
            hit = hit or av[0] <= ord(ch) <= av[1]
        elif op is c.CATEGORY:
            hit = hit or _in_category(av, ch)
        else:
            raise ValueError(f"unsupported in a class: {op}")
    return hit != negate


def search(pattern: str, text: str) -> bool:
    """`re.search(pattern, text) is not None`, without backtracking."""
    tree = parser.parse(pattern)
    if tree.state.flags & ~re.UNICODE:
        raise ValueError(f"flags are not supported: {pattern!r}")
    memo: dict[tuple[int, int], frozenset[int]] = {}
    n = len(text)

    def one(op: Any, av: Any, i: int) -> bool:
        if i >= n:
            return False
        ch = text[i]
        if op is c.LITERAL:
            return ord(ch) == av
        if op is c.NOT_LITERAL:
            return ord(ch) != av
        if op is c.ANY:
            return ch != "\n"
        return _in_set(av, ch)

    def seq(items: Any, starts: frozenset[int]) -> frozenset[int]:
        cur = starts
        for item in items:
            cur = frozenset().union(*(ends(item, p) for p in cur))
            if not cur:
                break
        return cur

    def ends(item: tuple[Any, Any], i: int) -> frozenset[int]:
        key = (id(item), i)
        if key in memo:
            return memo[key]
        op, av = item
        if op in (c.LITERAL, c.NOT_LITERAL, c.ANY, c.IN):
            out = frozenset({i + 1}) if one(op, av, i) else frozenset()
        elif op is c.AT:
            ok = {c.AT_BEGINNING: i == 0, c.AT_BEGINNING_STRING: i == 0, c.AT_END_STRING: i == n,
                  c.AT_END: i == n or (i == n - 1 and text[i] == "\n")}.get(av)
            if ok is None:
                raise ValueError(f"unsupported anchor: {av}")
            out = frozenset({i}) if ok else frozenset()
        elif op is c.SUBPATTERN:
            out = seq(av[-1], frozenset({i}))
        elif op is c.BRANCH:
            out = frozenset().union(*(seq(b, frozenset({i})) for b in av[1]))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            lo, hi, body = av
            result: set[int] = {i} if lo == 0 else set()
            cur, k, seen = frozenset({i}), 0, set()
            while cur and (hi is c.MAXREPEAT or k < hi):
                k += 1
                cur = seq(body, cur)
                if k >= lo:
                    if hi is c.MAXREPEAT and cur <= seen:
                        break  # nothing new can be reached
                    result |= cur
                    seen |= cur
            out = frozenset(result)
        else:
            raise ValueError(f"unsupported: {op}")
        memo[key] = out
        return out

    items = list(tree)
    return any(seq(items, frozenset({start})) for start in range(n + 1))


def nested_repeat(pattern: str) -> bool:
    """Whether a repeat sits inside another: where `re.search` may backtrack exponentially."""

    def walk(items: Any, inside: bool) -> bool:
        for op, av in items:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT):
                if inside or walk(av[2], True):
                    return True
            elif op in (c.SUBPATTERN, c.BRANCH):
                subs = [av[-1]] if op is c.SUBPATTERN else av[1]
                if any(walk(sub, inside) for sub in subs):
                    return True
        return False

    return walk(parser.parse(pattern), False)
