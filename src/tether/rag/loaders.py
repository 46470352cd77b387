"""Read Markdown, text, HTML and PDF files into sections (heading path + body text)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from tether.errors import TetherError

MARKDOWN = {".md", ".markdown", ".mdx"}
TEXT = {".txt", ".text", ".rst", ".log"}
HTML = {".html", ".htm"}
PDF = {".pdf"}
SUPPORTED = MARKDOWN | TEXT | HTML | PDF


class UnsupportedFile(TetherError, ValueError):
    """The file's type cannot be ingested."""


@dataclass(slots=True)
class Section:
    """A run of text under one heading path ("Refunds > Exceptions"; "" when there is none)."""

    heading: str
    text: str


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def parse_markdown(text: str) -> list[Section]:
    """Split at ATX headings (outside code fences); each section carries its heading path."""
    sections: list[Section] = []
    stack: list[tuple[int, str]] = []
    body: list[str] = []
    in_fence = False

    def flush() -> None:
        content = "\n".join(body).strip()
        if content:
            sections.append(Section(" > ".join(h for _, h in stack), content))
        body.clear()

    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        m = None if in_fence else _MD_HEADING.match(line)
        if m:
            flush()
            level = len(m.group(1))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, m.group(2)))
        else:
            body.append(line)
    flush()
    return sections


class _HTMLSections(HTMLParser):
    _SKIP = frozenset({"script", "style", "noscript", "template", "head"})
    _BLOCK = frozenset({"p", "div", "br", "li", "tr", "section", "article", "pre", "table", "ul", "ol", "blockquote"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.stack: list[tuple[int, str]] = []
        self.body: list[str] = []
        self.heading: list[str] | None = None
        self.level = 0
        self.skip = 0

    def _flush(self) -> None:
        content = re.sub(r"[ \t]+", " ", "".join(self.body))
        content = re.sub(r"\s*\n\s*", "\n", content).strip()
        if content:
            self.sections.append(Section(" > ".join(h for _, h in self.stack), content))
        self.body.clear()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self.heading, self.level = [], int(tag[1])
        elif tag in self._BLOCK:
            self.body.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self.skip = max(0, self.skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self.heading is not None:
            title = " ".join("".join(self.heading).split())
            while self.stack and self.stack[-1][0] >= self.level:
                self.stack.pop()
            if title:
                self.stack.append((self.level, title))
            self.heading = None
        elif tag in self._BLOCK:
            self.body.append("\n")

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        (self.heading if self.heading is not None else self.body).append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def parse_html(text: str) -> list[Section]:
    """Visible text split at <h1>..<h6>; scripts, styles and <head> are dropped."""
    parser = _HTMLSections()
    parser.feed(text)
    parser.close()
    return parser.sections


def parse_pdf(path: Path) -> list[Section]:
    """One section per page with text, headed "page N" (pypdf text extraction)."""
    from pypdf import PdfReader

    reader = PdfReader(str(path))
    out = []
    for n, page in enumerate(reader.pages, start=1):
        text = (page.extract_text() or "").strip()
        if text:
            out.append(Section(f"page {n}", text))
    return out


def load_file(path: str | Path) -> list[Section]:
    """Sections of one file, by its extension."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext in PDF:
        return parse_pdf(path)
    if ext not in SUPPORTED:
        raise UnsupportedFile(f"{path}: unsupported file type {ext or '(none)'}; supported: {', '.join(sorted(SUPPORTED))}")
    text = path.read_text(encoding="utf-8", errors="replace")
    if ext in MARKDOWN:
        return parse_markdown(text)
    if ext in HTML:
        return parse_html(text)
    body = text.strip()
    return [Section("", body)] if body else []
