"""Split sections into overlapping chunks of whitespace tokens, keeping the heading as context."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tether._errors import InvalidInput
from tether.rag._loaders import Section

_TOKEN = re.compile(r"\S+")


@dataclass(slots=True, frozen=True)
class Chunk:
    """A passage of one source. `id` is stable: the same source, position and content give the
    same id on every ingest."""

    id: str
    source: str
    position: int
    heading: str
    text: str

    @property
    def indexed_text(self) -> str:
        """What retrievers see: the heading path (context), then the passage."""
        return f"{self.heading}\n{self.text}" if self.heading else self.text


def chunk_id(source: str, position: int, heading: str, text: str) -> str:
    h = hashlib.sha256(f"{source}\x00{position}\x00{heading}\x00{text}".encode())
    return h.hexdigest()[:20]


def split_tokens(text: str, size: int, overlap: int) -> list[str]:
    """Windows of at most `size` tokens, each starting `size - overlap` tokens after the last.

    Slices of the original text, so line breaks inside a window survive.
    """
    if size <= 0:
        raise InvalidInput("chunk size must be positive")
    if not 0 <= overlap < size:
        raise InvalidInput("overlap must be at least 0 and smaller than the chunk size")
    spans = [m.span() for m in _TOKEN.finditer(text)]
    if not spans:
        return []
    out = []
    step = size - overlap
    start = 0
    while True:
        window = spans[start : start + size]
        out.append(text[window[0][0] : window[-1][1]])
        if start + size >= len(spans):
            return out
        start += step


def chunk_sections(source: str, sections: Iterable[Section], size: int = 200, overlap: int = 40) -> list[Chunk]:
    """Chunks of every section (a chunk never spans two sections), numbered in order."""
    chunks: list[Chunk] = []
    for section in sections:
        for piece in split_tokens(section.text, size, overlap):
            pos = len(chunks)
            chunks.append(Chunk(chunk_id(source, pos, section.heading, piece), source, pos, section.heading, piece))
    return chunks
