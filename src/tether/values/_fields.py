"""Per-field integrity: the fields of a tool's structured output the service itself sets or vouches for.

A tool whose output is untrusted as a whole may declare which fields of its records the service
assigns (a transaction's amount, sender and date; a file's id; a message's sender), each with a shape::

    @tool(untrusted_output=True, trusted_fields={"id": "id", "amount": "number", "sender": "iban"})

When the output is hidden behind a handle (tether.values), those fields are split off exactly: each
record's declared fields whose value fits the declared shape are shown to the model beside the handle,
and the same parts, substituted by handle (`$v3_1[0].amount`), carry a trusted label. Everything else
(an undeclared field, a value not of its shape, a field a record lacks, an output that is not JSON
records) stays hidden and untrusted, as the whole output was. A value built from trusted and untrusted
parts (a whole record, `$v3_1`) carries the untrusted label: labels join.

Shapes admit no free text (no spaces, no sentence), though a token an outsider picks (a user name) is
still text the model reads: declare a field only where the service assigns it or everyone who can choose
it is trusted (docs/hidden_values.md). The shapes: `id` (an integer, or a token of
letters, digits and `_.:@+/-` without spaces, at most 64 characters), `name` (the same, at most 40),
`number`, `boolean`, `date` (YYYY-MM-DD), `datetime` (YYYY-MM-DD HH:MM[:SS], `T` allowed), `email`, `iban`
(check digits valid), and `list[S]` (a list of at most 100 values of shape S). The field `*` declares the
items of an output that is a JSON list of values (channel names) instead of records. A declaration
naming a shape that does not exist, or a field that is not a plain name, is refused when the tool is
declared (`checked_fields`), rather than silently showing nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether._errors import InvalidInput

ITEMS = "*"  # the items of a list output themselves
FIELD_SHAPES = SHAPES = frozenset({"id", "name", "number", "boolean", "date", "datetime", "email", "iban"})
MAX_LIST = 100
MAX_VIEW_CHARS = 4_000  # the shown fields beyond this are left out (they stay reachable by handle)
_ID = re.compile(r"[A-Za-z0-9_.:@+/-]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9_.:@+/-]{1,40}")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?")
EMAIL = re.compile(r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}")
IBAN = re.compile(r"[A-Z]{2}\d{2}[A-Z0-9]{11,30}")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def valid_shape(shape: object) -> bool:
    """Whether `shape` is one of `SHAPES`, or `list[S]` of one."""
    if not isinstance(shape, str):
        return False
    if shape.startswith("list[") and shape.endswith("]"):
        return shape[5:-1] in SHAPES
    return shape in SHAPES


_SHAPE_NAMES = "id, name, number, boolean, date, datetime, email, iban, or list[S] of one of these"


def checked_fields(fields: object) -> dict[str, str]:
    """`fields` as a `trusted_fields` declaration (field name -> shape; a list of names: shape `id` each),
    or one `InvalidInput` naming the first field or shape that cannot work, and what may be declared."""
    if isinstance(fields, list | tuple | set | frozenset):
        names: list[Any] = list(fields)  # pyright: ignore[reportUnknownArgumentType]
        fields = dict.fromkeys(names, "id")
    if not isinstance(fields, Mapping):
        raise InvalidInput(f"trusted_fields must map field names to shapes, such as {{\"amount\": \"number\"}}, "
                           f"or list field names; got {type(fields).__name__} {_short(fields)}")
    out: dict[str, str] = {}
    for name, shape in fields.items():  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(name, str) or (name != ITEMS and _FIELD.fullmatch(name) is None):
            raise InvalidInput(f"trusted_fields: field {_short(name)} is not a field name (letters, digits and _, "
                               f"not starting with a digit; or {ITEMS!r} for the items of a list output)")
        if not valid_shape(shape):
            raise InvalidInput(f"trusted_fields: field {name!r} has shape {_short(shape)}, which does not exist; "
                               f"the shapes are {_SHAPE_NAMES}")
        out[name] = shape  # pyright: ignore[reportArgumentType]
    return out


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def iban_checks(text: str) -> bool:
    """Whether an IBAN's check digits are right (ISO 13616: the rearranged number mod 97 is 1)."""
    digits = "".join(str(int(c, 36)) for c in text[4:] + text[:4])
    return int(digits) % 97 == 1


def fits_shape(value: Any, shape: str) -> bool:
    """Whether `value` (as JSON gives it) is of `shape`; an unknown shape fits nothing (fail closed)."""
    if shape.startswith("list[") and shape.endswith("]"):
        inner = shape[5:-1]
        items: list[Any] = value if isinstance(value, list) else []  # pyright: ignore[reportUnknownVariableType]
        return isinstance(value, list) and len(items) <= MAX_LIST and inner in SHAPES \
            and all(fits_shape(v, inner) for v in items)
    if shape == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if shape == "number":
        return isinstance(value, int | float) and value == value and abs(value) != float("inf")
    if shape == "id" and isinstance(value, int):
        return abs(value) < 10 ** 18
    if not isinstance(value, str):
        return False
    pattern = {"id": _ID, "name": _NAME, "date": _DATE, "datetime": _DATETIME, "email": EMAIL,
               "iban": IBAN}.get(shape)
    if pattern is None or pattern.fullmatch(value) is None:
        return False
    return shape != "iban" or iban_checks(value)


@dataclass(frozen=True, slots=True)
class Split:
    """An output split by its declared fields: what the model is shown (JSON text, '' for nothing) and
    the JSON paths (`[0].amount`, `.id`, `[2]`) whose values are trusted."""

    shown: str
    paths: frozenset[str]


NOTHING = Split("", frozenset())


def split_fields(content: str, fields: Mapping[str, str], handle: str) -> Split:
    """The declared trusted fields of `content` (a JSON record, a list of records, or with `*` a list of
    values), each kept only when it fits its shape. A record shows only its trusted fields (its other keys
    are text its author may have chosen); a list item that does not fit is shown as its handle path."""
    if not fields:
        return NOTHING
    try:
        data: Any = json.loads(content)
    except ValueError:
        return NOTHING
    paths: set[str] = set()
    if isinstance(data, list) and ITEMS in fields:
        items: list[Any] = data  # pyright: ignore[reportUnknownVariableType]
        view_items: list[Any] = []
        for i, v in enumerate(items):
            if not isinstance(v, dict | list) and fits_shape(v, fields[ITEMS]):
                paths.add(f"[{i}]")
                view_items.append(v)
            else:
                view_items.append(f"{handle}[{i}]")
        return _capped(view_items, paths) if paths else NOTHING
    if isinstance(data, dict):
        view, own = _record(data, fields, "")  # pyright: ignore[reportUnknownArgumentType]
        return Split(json.dumps(view, ensure_ascii=False), frozenset(own)) if own else NOTHING
    if isinstance(data, list):
        rows: list[Any] = []
        for i, r in enumerate(data):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            view, own = _record(r, fields, f"[{i}]") if isinstance(r, dict) else ({}, set[str]())  # pyright: ignore[reportUnknownArgumentType]
            rows.append(view)
            paths |= own
        return _capped(rows, paths) if paths else NOTHING
    return NOTHING


def _record(record: dict[str, Any], fields: Mapping[str, str], at: str) -> tuple[dict[str, Any], set[str]]:
    view: dict[str, Any] = {}
    own: set[str] = set()
    for name, shape in fields.items():
        if name == ITEMS or _FIELD.fullmatch(name) is None or name not in record:
            continue
        if fits_shape(record[name], shape):
            view[name] = record[name]
            own.add(f"{at}.{name}")
    return view, own


def _capped(items: list[Any], paths: set[str]) -> Split:
    """A list view of at most MAX_VIEW_CHARS: the items past it left out, and their paths untrusted."""
    text = json.dumps(items, ensure_ascii=False)
    if len(text) <= MAX_VIEW_CHARS:
        return Split(text, frozenset(paths))
    kept: list[Any] = []
    size = 2
    for item in items:
        piece = len(json.dumps(item, ensure_ascii=False)) + 2
        if size + piece > MAX_VIEW_CHARS - 60:
            break
        kept.append(item)
        size += piece
    n = len(kept)
    keep = {p for p in paths if int(p[1:p.index("]")]) < n}
    note = f"(the first {n} of {len(items)} items; the rest by handle only)"
    return Split(json.dumps(kept, ensure_ascii=False)[:-1] + f', "{note}"]' if kept else "", frozenset(keep))


def view_line(shown: str) -> str:
    """What the model is told of the split beside the handle's line."""
    return f" The service vouches for these fields of it (shown, trusted; the rest stays hidden): {shown}."


def trusted_fields_of(declared: Any) -> Mapping[str, str] | None:
    """A tool's declared trusted fields (`Declares.trusted_fields`), or None."""
    fields = getattr(declared, "trusted_fields", None)
    return fields if isinstance(fields, Mapping) and fields else None
