"""Spotting degenerate repetition in generated text: a small model that starts repeating itself
("I'm sorry for any mistakes. I'm sorry for any mistakes. ...") never stops on its own, and
every further token is time spent for nothing."""

from __future__ import annotations

import re

MIN_UNIT = 8  # characters: shorter units ("ha ha ha", table rules) are legitimate text
MAX_UNIT = 400
TIMES = 3  # a unit seen this many times in a row is a loop
MIN_SPAN = 100  # ... and over at least this many characters (ten identical table rows, not three)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?\n]+")


def repetition_cut(text: str) -> int | None:
    """Where to cut `text` when it ends in a loop, keeping the first copy of the repeated part;
    None when it does not. A loop is the same unit (8 to 400 characters) three times in a row at
    the end over 100 characters or more, or a sentence (20 or more characters, 10 of them
    letters) said for the third time."""
    n = len(text)
    for unit in range(MIN_UNIT, min(MAX_UNIT, n // TIMES) + 1):
        times = max(TIMES, -(-MIN_SPAN // unit))  # short units must repeat over MIN_SPAN characters
        tail = text[n - unit:]
        if times * unit <= n and text[n - times * unit:] == tail * times and tail.strip():
            start = n - times * unit
            while start >= unit and text[start - unit:start] == tail:
                start -= unit
            return start + unit
    seen: dict[str, int] = {}
    for m in _SENTENCE.finditer(text):
        key = " ".join(m.group().split()).lower()
        if len(key) < 20 or sum(c.isalpha() for c in key) < 10:  # prose, not table rows or rules
            continue
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == TIMES:
            return m.start()
    return None


class RepetitionGuard:
    """Fed the pieces of a streamed reply; says when to stop. Checks after each piece that ends a
    sentence or line, so the cost stays small per token."""

    def __init__(self) -> None:
        self.text = ""
        self.cut: int | None = None

    def feed(self, piece: str) -> bool:
        """Add a piece; True once the text has become a loop (then `self.cut` is where to cut)."""
        self.text += piece
        if self.cut is None and piece and any(c in piece for c in ".!?\n"):
            self.cut = repetition_cut(self.text.rstrip(" ") if not piece.endswith("\n") else self.text)
        return self.cut is not None

    def result(self) -> str:
        return self.text if self.cut is None else self.text[: self.cut].rstrip()
