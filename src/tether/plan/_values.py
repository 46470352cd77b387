"""Values with capabilities: every value a plan computes carries where it came from.

A `Value` holds a plain scalar, or a list or dict of `Value`s, and its `Caps`: the set of its sources
("user": the user's request, which is all the planner saw; "tool:NAME": a tool's result;
"extract": a quarantined reader's answer) and who may read it (None: anyone). Combining values
unions their sources and intersects their readers; nothing ever removes a source.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tether._errors import InvalidInput

USER = "user"
EXTRACT = "extract"
DELEGATED = "delegated"  # a plan's literals when its request came from a model that read untrusted content


@dataclass(frozen=True, slots=True)
class Caps:
    """Where a value came from (`sources`) and who may read it (`readers`; None: anyone)."""

    sources: frozenset[str] = frozenset()
    readers: frozenset[str] | None = None

    def __or__(self, other: Caps) -> Caps:
        if other is self or (not other.sources and other.readers is None):
            return self
        if not self.sources and self.readers is None:
            return other
        readers = self.readers if other.readers is None else other.readers if self.readers is None \
            else self.readers & other.readers
        return Caps(self.sources | other.sources, readers)

    @staticmethod
    def of(*sources: str, readers: Iterable[str] | None = None) -> Caps:
        return Caps(frozenset(sources), None if readers is None else frozenset(readers))

    @staticmethod
    def union(all_caps: Iterable[Caps]) -> Caps:
        out = NONE
        for c in all_caps:
            out = out | c
        return out

    def describe(self) -> str:
        return ", ".join(sorted(self.sources)) or "no source"


NONE = Caps()
LITERAL = Caps.of(USER)  # what the planner wrote: it saw nothing but the user's request


class Value:
    """A plain scalar, or a list / dict of Values, with its capabilities."""

    __slots__ = ("caps", "v")

    def __init__(self, v: Any, caps: Caps) -> None:
        self.v = v
        self.caps = caps

    def __repr__(self) -> str:
        return f"Value({plain(self)!r}, {self.caps.describe()})"

    def with_caps(self, extra: Caps) -> Value:
        """This value with `extra` sources added to it (its contents keep their own)."""
        return self if extra is NONE else Value(self.v, self.caps | extra)


def tag(obj: Any, caps: Caps) -> Value:
    """A plain Python object (a tool's result, parsed JSON) as a Value, `caps` on every part."""
    if isinstance(obj, Value):
        return obj.with_caps(caps)
    if isinstance(obj, dict):
        return Value({str(k): tag(v, caps) for k, v in obj.items()}, caps)
    if isinstance(obj, (list, tuple)):
        return Value([tag(v, caps) for v in obj], caps)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return Value(obj, caps)
    raise InvalidInput(f"a plan value must be JSON-like data, not {type(obj).__name__}")


def plain(value: Value) -> Any:
    """The plain Python object a Value holds (what a tool is called with)."""
    v = value.v
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


def parts(value: Value) -> Iterator[Value]:
    """The value and every Value inside it."""
    yield value
    v = value.v
    if isinstance(v, list):
        for x in v:
            yield from parts(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from parts(x)


def deep_caps(value: Value) -> Caps:
    """Everything a value depends on: its own caps and those of all it contains."""
    return Caps.union(p.caps for p in parts(value))
