"""Read Markdown, text, HTML and PDF files into sections (heading path + body text)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from tether._errors import TetherError

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


def parse_pdf(path: Path, data: bytes | None = None) -> list[Section]:
    """One section per page with text, headed "page N" (pypdf text extraction)."""
    import io

    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data) if data is not None else str(path))
    out = []
    for n, page in enumerate(reader.pages, start=1):
        text = (page.extract_text() or "").strip()
        if text:
            out.append(Section(f"page {n}", text))
    return out


_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
# C0 controls that do not occur in text (tab, newlines, form feed and escape do)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f\x7f\ufffd]")


def _utf16_without_bom(data: bytes) -> str | None:
    """UTF-16 text written without a byte order mark: mostly ASCII, so one byte of each pair is 0."""
    if len(data) < 4 or len(data) % 2:
        return None
    even, odd = data[0::2], data[1::2]
    for zeros, other, codec in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        if zeros.count(0) >= 0.9 * len(zeros) and other.count(0) <= 0.01 * len(other):
            return codec
    return None


# The share of bytes above 0x7F allowed in a file read as Windows-1252 (French or German text has
# 2-5 %, Icelandic under 15 %)
MAX_HIGH_BYTES = 0.3


def decode_text(data: bytes, name: str = "file") -> str:
    """The text of a file's bytes: a byte order mark names the encoding (UTF-8/16/32), else UTF-16
    by its zero bytes, else UTF-8, else Windows-1252 when at most `MAX_HIGH_BYTES` of its bytes are
    above 0x7F. Binary content (an executable, an image, random bytes) raises UnsupportedFile
    rather than being indexed as text."""
    codec = next((c for bom, c in _BOMS if data.startswith(bom)), None) or _utf16_without_bom(data)
    if codec is None and b"\x00" in data:
        raise UnsupportedFile(f"{name}: binary content (zero bytes), not text")
    if codec is not None:
        text = data.decode(codec, errors="replace")
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            # Windows-1252 text is mostly ASCII (a few accented letters, quotes, dashes); bytes
            # mostly above 0x7F that are not UTF-8 are binary, or text in an encoding we cannot tell
            head = data[:65536]
            high = sum(1 for b in head if b > 0x7F)
            if high > MAX_HIGH_BYTES * len(head):
                raise UnsupportedFile(f"{name}: binary content ({100 * high // len(head)}% of its bytes are above "
                                      "0x7F and it is not UTF-8; Windows-1252 text has few), not text; if it is "
                                      "text, save it as UTF-8") from None
            text = data.decode("cp1252", errors="replace")
    bad = len(_CONTROL.findall(text[:65536]))
    if bad > 0.01 * min(len(text), 65536) + 2:
        raise UnsupportedFile(f"{name}: binary content ({bad} control characters), not text")
    return text.lstrip("\ufeff")


def read_regular(path: str | Path) -> bytes:
    """The bytes of a regular file, opened without blocking and refused unless `fstat` says it is
    one (a FIFO found in a folder walk would otherwise wait for a writer forever). A path given by
    the user goes through `refuse_special` first, so a device is never opened."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        kind = _special_kind(info.st_mode)
        if kind is not None:
            raise UnsupportedFile(_not_regular(path, kind))
        parts = [os.read(fd, info.st_size + 1)]  # one read for a file that did not grow meanwhile
        while parts[-1]:
            parts.append(os.read(fd, 1 << 20))
        return b"".join(parts)
    finally:
        os.close(fd)


def refuse_special(path: str | Path) -> None:
    """UnsupportedFile when `path` is a FIFO, socket, device or folder (by `os.stat`; never opened)."""
    kind = _special_kind(os.stat(path).st_mode)
    if kind is not None:
        raise UnsupportedFile(_not_regular(path, kind))


def _not_regular(path: str | Path, kind: str) -> str:
    return f"{path}: a {kind}, not a regular file; only files and folders can be ingested"


def _special_kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return ("FIFO (named pipe)" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode)
            else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "folder" if stat.S_ISDIR(mode)
            else "special file")


def load_file(path: str | Path, data: bytes | None = None) -> list[Section]:
    """Sections of one file, by its extension (`data`: its bytes, when already read)."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext not in SUPPORTED:
        raise UnsupportedFile(f"{path}: unsupported file type {ext or '(none)'}; supported: {', '.join(sorted(SUPPORTED))}")
    if data is None:
        refuse_special(path)
        data = read_regular(path)
    if ext in PDF:
        return parse_pdf(path, data)
    text = decode_text(data, str(path))
    if ext in MARKDOWN:
        return parse_markdown(text)
    if ext in HTML:
        return parse_html(text)
    body = text.strip()
    return [Section("", body)] if body else []
