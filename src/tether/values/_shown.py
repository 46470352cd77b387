"""Private outputs the model was shown: their readers follow the text the model copies out of them.

A hidden value's readers reach a call through substitution (exact data flow). An output the model reads
directly (the visible mode, `hide_output=False`, a tool that does not hide) has no handle to follow; the
evidence tether has of what the model copied from it is exact substring provenance: an argument holds a
span of at least `MIN_SPAN` characters of the shown text (compared case-folded, whitespace collapsed,
Unicode-compatibility folded), or is as a whole a token of it with a digit and at least `MIN_WHOLE`
characters (an amount, an account number). Such an argument carries the readers of what it was copied
from; the call is then judged by the same rule as hidden values (`tether.values._readers.leak`).

What is not evidence (the model paraphrased, translated or summarised the text) is not followed: that
is as far as data flow can be known for text the model has seen.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tether.values._labels import USER, Label
from tether.values._readers import declared_readers, record_label

MIN_SPAN = 12  # a copied span shorter than this is too likely a coincidence ("the meeting is")
MIN_WHOLE = 4  # a whole argument with a digit this long, found as a token of a private text ("4.2M")
GRAM = 8  # index grams of this length every STRIDE characters: any common span >= GRAM + STRIDE - 1 meets one
STRIDE = MIN_SPAN - GRAM + 1
MAX_SHOWN = 64  # the latest private texts kept (each is searched for every effect call's arguments)
MAX_TEXT = 8_000  # of each, the first characters (a shown output is capped at 4,000 by default)


def norm(text: str) -> str:
    """The form spans are compared in: compatibility-folded, lowercased, whitespace collapsed."""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.lower().split())


@dataclass(slots=True)
class ShownText:
    """One private text the model saw, normalised, with its label and an index of its grams."""

    text: str
    label: Label
    grams: dict[str, list[int]] = field(default_factory=dict[str, list[int]])

    def __post_init__(self) -> None:
        t = self.text
        for i in range(0, max(len(t) - GRAM + 1, 0), STRIDE):
            self.grams.setdefault(t[i:i + GRAM], []).append(i)

    def copied(self, value: str) -> bool:
        """Whether normalised `value` holds a span of this text of `MIN_SPAN` characters or more, or is
        as a whole a token of it (with a digit, `MIN_WHOLE` characters or more)."""
        t = self.text
        if MIN_WHOLE <= len(value) < MIN_SPAN and any(c.isdigit() for c in value):
            start = t.find(value)
            while start != -1:
                end = start + len(value)
                if (start == 0 or not t[start - 1].isalnum()) and (end == len(t) or not t[end].isalnum()):
                    return True
                start = t.find(value, start + 1)
        for i in range(len(value) - GRAM + 1):
            for p in self.grams.get(value[i:i + GRAM], ()):
                left = 0
                while left < min(i, p) and value[i - left - 1] == t[p - left - 1]:
                    left += 1
                right = GRAM
                while i + right < len(value) and p + right < len(t) and value[i + right] == t[p + right]:
                    right += 1
                if left + right >= MIN_SPAN:
                    return True
        return False


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():  # pyright: ignore[reportUnknownVariableType]
            yield str(k)  # pyright: ignore[reportUnknownArgumentType]
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:  # pyright: ignore[reportUnknownVariableType]
            yield from _leaves(v)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)


def private_texts(tool: Any, content: str, label: Label) -> list[tuple[str, Label]]:
    """The texts of an output shown to the model that have readers, each with its own: a record of an
    output declaring its reader fields is its own text (an inbox: each e-mail readable by its own
    correspondents), anything else the whole output with `label`. Public outputs give none."""
    decl = declared_readers(tool)
    if isinstance(decl, tuple):
        try:
            data: Any = json.loads(content)
        except ValueError:
            data = None
        rows: list[Any] = [data] if isinstance(data, dict) else data if isinstance(data, list) else []  # pyright: ignore[reportUnknownVariableType]
        records: list[dict[str, Any]] = [r for r in rows if isinstance(r, dict)]  # pyright: ignore[reportUnknownVariableType]
        if records:
            return [("\n".join(_leaves(r)), record_label(decl, r).join(label)) for r in records]
        label = label.join(Label(readers=frozenset({USER})))  # reader fields, no records: the user's (fail closed)
    if label.readers is None or label.secret:  # public; secrets are found by value (tether.policy._leaks)
        return []
    return [(content, label)]


def note(shown: list[ShownText], texts: list[tuple[str, Label]]) -> None:
    """Remember private texts the model was shown (the latest `MAX_SHOWN`)."""
    for text, label in texts:
        t = norm(text[:MAX_TEXT])
        if t and not any(s.text == t and s.label == label for s in shown):
            shown.append(ShownText(t, label))
    del shown[:-MAX_SHOWN]


def copied_labels(shown: list[ShownText], args: dict[str, Any], skip: set[str]) -> dict[str, Label]:
    """Top-level argument -> the join of the readers of every shown private text a value under it was
    copied from (arguments copying none are left out). `skip`: top-level arguments not to look in."""
    out: dict[str, Label] = {}
    if not shown:
        return out
    for name, value in args.items():
        if name in skip:
            continue
        for leaf in _leaves(value):
            v = norm(leaf)
            if len(v) < MIN_WHOLE:
                continue
            for s in shown:
                if s.copied(v):
                    out[name] = out[name].join(s.label) if name in out else s.label
    return out
