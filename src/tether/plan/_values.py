"""Labelled values: every value a plan computes carries its `tether.values.Label`.

A `Value` holds a plain scalar, or a list or dict of `Value`s, and its label (the one model of
hidden values and plan mode): integrity with its sources ("user": the user's request, which is all
the planner saw; "tool:NAME": a tool's result; "extract": a quarantined reader's answer) and who may
read it (readers: None is anyone). Combining values joins their labels: untrusted wins, sources add
up, readers intersect; nothing ever removes a source or adds a reader.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tether._errors import InvalidInput
from tether.values._labels import TRUSTED, USER, Label, join_all
from tether.values._readers import record_label

EXTRACT = "extract"
DELEGATED = "delegated"  # a plan's literals when its request came from a model that read untrusted content

LITERAL = Label("trusted", frozenset({USER}))  # what the planner wrote: it saw nothing but the user's request
DELEGATED_LITERAL = Label("untrusted", frozenset({DELEGATED}))
USER_ONLY = Label(readers=frozenset({USER}))

__all__ = ["DELEGATED", "DELEGATED_LITERAL", "EXTRACT", "LITERAL", "TRUSTED", "USER", "Label", "Value",
           "deep_label", "join_all", "parts", "plain", "tag", "with_readers"]


class Value:
    """A plain scalar, or a list / dict of Values, with its label."""

    __slots__ = ("label", "v")

    def __init__(self, v: Any, label: Label) -> None:
        self.v = v
        self.label = label

    def __repr__(self) -> str:
        return f"Value({plain(self)!r}, {self.label.describe()})"

    def with_label(self, extra: Label) -> Value:
        """This value with `extra` joined to its label (its contents keep their own)."""
        return self if extra is TRUSTED else Value(self.v, self.label | extra)


def tag(obj: Any, label: Label) -> Value:
    """A plain Python object (a tool's result, parsed JSON) as a Value, `label` on every part."""
    if isinstance(obj, Value):
        return obj.with_label(label)
    if isinstance(obj, dict):
        return Value({str(k): tag(v, label) for k, v in obj.items()}, label)
    if isinstance(obj, (list, tuple)):
        return Value([tag(v, label) for v in obj], label)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return Value(obj, label)
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


def deep_label(value: Value) -> Label:
    """Everything a value depends on, and who may read all of it: the join of its own label and
    those of all it contains."""
    return join_all(p.label for p in parts(value))


def with_readers(value: Value, declared: frozenset[str] | tuple[str, ...] | None) -> Value:
    """A tool's output with the readers its declaration gives each record (`output_readers` naming
    fields: a dict, or each dict of a list, readable by the user and whoever its fields name). A list's
    own label (its length, which records it holds) is readable by anyone who may read one of them."""
    if not isinstance(declared, tuple):
        return value

    def record(v: Value) -> Value:
        return _relabel(v, record_label(declared, plain(v)) if isinstance(v.v, dict) else USER_ONLY)

    if isinstance(value.v, dict):
        return record(value)
    if isinstance(value.v, list):
        items = [record(x) for x in value.v]
        readers = frozenset({USER}).union(*[x.label.readers or () for x in items])
        return Value(items, value.label | Label(readers=readers))
    return _relabel(value, USER_ONLY)  # not a record: the user's alone (fail closed)


def _relabel(value: Value, extra: Label) -> Value:
    """`value` with `extra` joined on it and on every part inside it."""
    v = value.v
    if isinstance(v, list):
        v = [_relabel(x, extra) for x in v]
    elif isinstance(v, dict):
        v = {k: _relabel(x, extra) for k, x in v.items()}
    return Value(v, value.label | extra)
