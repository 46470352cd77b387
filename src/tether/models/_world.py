"""What a small model may choose from, taken from the world instead of its imagination.

`resolve_values` turns a parameter's value-source declaration (`tether.tools.base.files_source`,
`request_words_source`) into the exact values the grammar offers; `result_quotes` cuts the tool
results of a conversation into the lines and sentences a final answer may copy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.models._gbnf import Offered
from tether.types import Message

_SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                        ".pytest_cache", ".ruff_cache", ".tox", "dist", "build"})
_WORD = re.compile(r"[\w][\w.'/:-]*[\w]|[\w]")
MAX_QUOTE_CHARS = 300
MAX_QUOTES = 400


def workspace_files(root: str | Path, limit: int) -> list[str] | None:
    """Relative paths of the regular files under `root` (hidden and tool folders skipped), sorted;
    None when there are more than `limit` or `root` is not a folder."""
    base = Path(root)
    if not base.is_dir():
        return None
    found: list[str] = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in files:
            if name.startswith("."):
                continue
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                found.append(path.relative_to(base).as_posix())
                if len(found) > limit:
                    return None
    return sorted(found)


def request_words(messages: Sequence[Message]) -> list[str]:
    """The words of the latest user message, in order, each once (case kept)."""
    for m in reversed(messages):
        if m.role == "user" and m.content.strip():
            return list(dict.fromkeys(_WORD.findall(m.content)))
    return []


def _used_values(messages: Sequence[Message], key: str) -> set[str]:
    """Values already passed as argument `key` in earlier calls that got a non-error result."""
    ok_ids = {m.tool_call_id for m in messages if m.role == "tool" and not m.content.startswith("ERROR")}
    return {str(c.arguments.get(key)) for m in messages for c in m.tool_calls
            if c.id in ok_ids and isinstance(c.arguments, dict) and key in c.arguments}


def resolve_values(source: dict[str, Any], messages: Sequence[Message], *, fresh_only: bool) -> Offered | None:
    """What a declared value source offers for this conversation (None: no restriction).

    `fresh_only` leaves out files already read successfully (a tiny model otherwise reads the
    same file again instead of the second one), as long as at least one file is left.
    """
    kind = source.get("from")
    if kind == "files":
        files = workspace_files(str(source.get("root", "")), int(source.get("max", 200)))
        if not files:
            return None
        if fresh_only:
            used = _used_values(messages, str(source.get("param", "file_path")))
            files = [f for f in files if f not in used] or files
        return Offered(values=tuple(files))
    if kind == "request":
        words = request_words(messages)
        return Offered(words=tuple(words), max_words=int(source.get("max_words", 8))) if words else None
    return None


_TAG_LINE = re.compile(r"^</?[A-Za-z][\w-]*(\s[^>]*)?>$")
_META_LINE = re.compile(r"^(\[\d+\]\s*)?(\S+=\S+\s*)+$")  # e.g. "[1] id=x source=y score=0.5"
_NOTE = "is data returned by"  # the policy's note after untrusted content
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+(?=\S)")


def _lines(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _TAG_LINE.match(line) or _META_LINE.match(line) or (_NOTE in line and line.startswith("(")):
            out.append("")
            continue
        if line.startswith("section:"):
            line = line[len("section:"):].strip()
        out.append(line)
    return out


def _clip(text: str) -> str | None:
    text = " ".join(text.split())
    if len(text) <= MAX_QUOTE_CHARS:
        return text or None
    cut = text[:MAX_QUOTE_CHARS].rsplit(" ", 1)[0]
    return cut or None


def result_quotes(messages: Sequence[Message]) -> list[str]:
    """Lines and sentences of the conversation's successful tool results, each once.

    Every line is offered as is; a paragraph (lines up to a blank one) is also offered sentence
    by sentence with its line breaks joined, since wrapped text breaks sentences across lines.
    """
    quotes: list[str] = []
    for m in messages:
        if m.role != "tool" or m.content.startswith("ERROR"):
            continue
        lines = _lines(m.content)
        paragraphs: list[list[str]] = [[]]
        for line in lines:
            if line:
                paragraphs[-1].append(line)
                quote = _clip(line)
                if quote:
                    quotes.append(quote)
            elif paragraphs[-1]:
                paragraphs.append([])
        for para in paragraphs:
            for sentence in _SENTENCE_END.split(" ".join(para)):
                quote = _clip(sentence)
                if quote:
                    quotes.append(quote)
    return list(dict.fromkeys(quotes))[-MAX_QUOTES:]
