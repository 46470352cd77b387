"""What the CLI writes to a terminal carries no control sequences it did not put there itself.

A model's answer, a tool's arguments or a provider's error text can hold escape sequences that a
terminal obeys: CSI (cursor moves, erase line, colours that hide text), OSC 8 (a link whose text
lies about its target), OSC 52 (write the clipboard), DCS/APC strings, 8-bit C1 controls, and
bare C0 controls such as carriage return or backspace that overwrite what was shown. `clean`
removes all of them, keeping newline and tab; `--raw` turns it off for the answer.
"""

from __future__ import annotations

import re
from typing import TextIO

_SEQUENCE = re.compile(
    r"""
      \x1b\[[0-?]*[ -/]*[@-~]?            # CSI ... final byte
    | \x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?   # OSC (8: links, 52: clipboard) ... BEL or ST
    | \x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?        # DCS, SOS, PM, APC strings ... ST
    | \x1b[ -/]*[0-~]?                  # any other escape sequence (charset, keypad, RIS ...)
    | \x9b[0-?]*[ -/]*[@-~]?            # 8-bit CSI
    | \x9d[^\x07\x9c]*(?:\x07|\x9c)?    # 8-bit OSC
    | [\x90\x98\x9e\x9f][^\x9c]*\x9c?   # 8-bit DCS, SOS, PM, APC
    | [\x00-\x08\x0b-\x1f\x7f-\x9f]     # every other C0 / C1 control but \t and \n
    """,
    re.VERBOSE,
)
_ANY_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_C1 = re.compile(r"[\x7f-\x9f]")


def clean(text: str) -> str:
    """`text` without terminal control sequences and controls (newline and tab are kept)."""
    if _ANY_CONTROL.search(text) is None:  # the common case costs one scan
        return text
    return _SEQUENCE.sub("", text)


def json_safe(text: str) -> str:
    """JSON text with DEL and C1 controls written as \\u escapes (JSON escapes C0 itself): the same
    data, nothing a terminal obeys. These characters only occur inside JSON strings."""
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


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


__all__ = ["CleanWriter", "clean", "json_safe"]
