"""What a small model may choose from, taken from the world instead of its imagination.

`resolve_values` turns a parameter's value-source declaration (`tether.tools._base.files_source`,
`request_words_source`) into the exact values the grammar offers; `result_quotes` cuts the tool
results of a conversation into the lines and sentences a final answer may copy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether._types import NOTE_NAME, Message
from tether.models._gbnf import Offered
from tether.tools._beneath import Beneath

_SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                        ".pytest_cache", ".ruff_cache", ".tox", "dist", "build"})
_WORD = re.compile(r"[\w][\w.'/:-]*[\w]|[\w]")
MAX_QUOTE_CHARS = 300


def workspace_files(root: str | Path, limit: int) -> list[str] | None:
    """Relative paths of the regular files under `root` (hidden and tool folders skipped, symbolic
    links left out, walked by directory descriptors), sorted; None when there are more than `limit`
    or `root` is not a folder."""
    walker = Beneath(root)
    try:
        fd = walker.open_dir(".")
    except OSError:
        return None
    found: list[str] = []
    try:
        for entry in walker.walk(fd, ".", skip_dirs=lambda name: name.startswith(".") or name in _SKIP_DIRS):
            if entry.is_dir or entry.name.startswith("."):
                continue
            found.append(entry.path)
            if len(found) > limit:
                return None
    finally:
        os.close(fd)
    return sorted(found)


def latest_request(messages: Sequence[Message]) -> str:
    """The latest non-empty user message ("" when there is none); the loop's own notes are not requests."""
    for m in reversed(messages):
        if m.role == "user" and m.name != NOTE_NAME and m.content.strip():
            return m.content
    return ""


def request_words(messages: Sequence[Message]) -> list[str]:
    """The words of the latest user message, in order, each once (case kept)."""
    return list(dict.fromkeys(_WORD.findall(latest_request(messages))))


def _used_values(messages: Sequence[Message], key: str) -> set[str]:
    """Values already passed as argument `key` in earlier calls that got a non-error result."""
    ok_ids = {m.tool_call_id for m in messages if m.role == "tool" and not m.content.startswith("ERROR")}
    return {str(c.arguments.get(key)) for m in messages for c in m.tool_calls
            if c.id in ok_ids and isinstance(c.arguments, dict) and key in c.arguments}


def resolve_values(source: dict[str, Any], messages: Sequence[Message], *, fresh_only: bool) -> Offered | None:
    """What a declared value source offers for this conversation (None: no restriction).

    `fresh_only` (tiny models) offers the files the request names when it names any, and leaves
    out those already read successfully (a tiny model otherwise reads the same file again
    instead of the second one); with none left the tool is not offered, and while a named file
    is unread there is no answer yet (the model answered after the first of two files).
    """
    kind = source.get("from")
    if kind == "files":
        files = workspace_files(str(source.get("root", "")), int(source.get("max", 200)))
        if not files:
            return None
        if fresh_only:
            # The files the request names, when it names any; those not read yet first.
            request = latest_request(messages)
            named = [f for f in files if re.search(rf"(?<![\w/.-]){re.escape(f)}(?![\w/-])", request)]
            files = named or files
            used = _used_values(messages, str(source.get("param", "file_path")))
            files = [f for f in files if f not in used]
            if not files:  # every file it may read is read: no reading the same one again
                return Offered(exhausted=True)
            # A file the request names and nobody read yet: read it before answering.
            return Offered(values=tuple(files), pending=bool(named))
        return Offered(values=tuple(files))
    if kind == "request" and isinstance(source.get("match"), str):
        try:
            spans = [m.group().strip() for m in re.finditer(source["match"], latest_request(messages))]
        except re.error:
            return None
        spans = [s for s in spans if s]
        return Offered(values=tuple(spans)) if spans else None
    if kind == "request":
        words = request_words(messages)
        return Offered(words=tuple(words), max_words=int(source.get("max_words", 8))) if words else None
    return None


_TAG_LINE = re.compile(r"^</?[A-Za-z][\w-]*(\s[^>]*)?>$")
_META_LINE = re.compile(r"^(\[\d+\]\s*)?(\S+=\S+\s*)+$")  # e.g. "[1] id=x source=y score=0.5"
_NOTE = "is data returned by"  # the policy's note after untrusted content
_WRAPPED = 60  # a paragraph with a line this long is wrapped prose: offered sentence by sentence too
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+(?=\S)")


def _lines(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _TAG_LINE.match(line) or _META_LINE.match(line) or (_NOTE in line and line.startswith("(")):
            out.append("")
            continue
        out.append("" if line.startswith("section:") else line)
    return out


def _clip(text: str) -> str | None:
    text = " ".join(text.split())
    if len(text) <= MAX_QUOTE_CHARS:
        return text or None
    cut = text[:MAX_QUOTE_CHARS].rsplit(" ", 1)[0]
    return cut or None


def _result_lines(content: str) -> list[str]:
    """The lines of one result, and its paragraphs sentence by sentence, each once."""
    quotes: list[str] = []
    paragraphs: list[list[str]] = [[]]
    for line in _lines(content):
        if line:
            paragraphs[-1].append(line)
            quote = _clip(line)
            if quote:
                quotes.append(quote)
        elif paragraphs[-1]:
            paragraphs.append([])
    for para in paragraphs:
        if len(para) < 2 or max(len(line) for line in para) < _WRAPPED:
            continue  # short lines (key = value, CSV rows) are whole already
        for sentence in _SENTENCE_END.split(" ".join(para)):
            quote = _clip(sentence)
            if quote:
                quotes.append(quote)
    return list(dict.fromkeys(quotes))


_STOP = frozenset(["a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "has", "have", "how", "i", "in", "is", "it", "me", "my", "of", "on", "or", "read", "please", "set", "tell", "that", "the", "their", "there", "these", "this", "to", "was", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your"])


def _stems(text: str) -> set[str]:
    out = set()
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in _STOP:
            continue
        for suffix in ("ing", "es", "ed", "s"):
            if len(word) > len(suffix) + 2 and word.endswith(suffix):
                word = word[: -len(suffix)]
                break
        out.add(word)
    return out


def _relevant(quotes: list[str], request: str, limit: int) -> list[str]:
    """The quotes sharing the most words with the request (all tied ones); all when none shares any."""
    wanted = _stems(request)
    scored = [(len(_stems(q) & wanted), q) for q in quotes]
    best = max((score for score, _ in scored), default=0)
    if best == 0:
        return quotes[:limit]
    return [q for score, q in scored if score == best][:limit]


def result_quotes(messages: Sequence[Message], *, limit: int = 40) -> list[list[str]]:
    """For each successful tool result since the latest user message, the texts an answer may
    copy from it: its lines and sentences that share the most words with the request.

    A tiny model left to choose among every line copies the first one ("[server]" for a port);
    among the few that match the question it copies the one that answers.
    """
    start = max((i for i, m in enumerate(messages) if m.role == "user" and m.name != NOTE_NAME), default=-1)
    request = latest_request(messages)
    groups = []
    for m in messages[start + 1 :]:
        if m.role != "tool" or m.content.startswith("ERROR"):
            continue
        quotes = _relevant(_result_lines(m.content), request, limit)
        if quotes:
            groups.append(quotes)
    return groups
