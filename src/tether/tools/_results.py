"""Shaping and capping tool results; the full text stays behind a handle `read_result` pages through."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, is_dataclass
from typing import IO, Any, Protocol, final

from tether._errors import InvalidInput
from tether.tools._base import Tool, ToolContext, tool

DEFAULT_MAX_RESULT_CHARS = 4_000


@final
@dataclass(slots=True, frozen=True)
class ToolOutput:
    """A tool's result with what it knows exactly about where that result came from: `untrusted`
    says whether it was computed from untrusted content. True always taints the run; False is
    believed only from a tool declared `exact_provenance=True` (a sub-agent that
    read nothing untrusted, a plan worker whose answer depends on trusted sources only); otherwise
    the tool's declaration (`untrusted_output`) decides."""

    value: Any
    untrusted: bool


def shape(value: Any) -> str:
    """Turn whatever a tool returned into the text the model reads."""
    if type(value) is ToolOutput:  # (final: no subclass to look for)
        value = value.value
    if value is None:
        return "(no output)"
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return f"(binary output, {len(value)} bytes, not shown)"
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    elif is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)




def new_handle() -> str:
    """An unguessable handle (64 random bits): knowing another run's handle is not enough anyway,
    but guessing one must not even be possible."""
    return "r_" + secrets.token_hex(8)


class Results(Protocol):
    """Where capped results are kept: this temporary-file store, or the durable run store."""

    def put(self, text: str, owner: str | None = None) -> str: ...

    def get(self, handle: str, owner: str | None = None) -> str | None: ...


class ResultStore:
    """Keeps the full text of capped results, off the heap, so memory stays flat however many large
    results a run produces. Texts go to an anonymous temporary file (opened on first use) and a
    handle maps to their place in it; past `max_total_chars` the oldest are forgotten, and
    `read_result` says so for their handles.
    """

    def __init__(self, max_total_chars: int = 100_000_000) -> None:
        self.max_total_chars = max_total_chars
        # handle -> offset, bytes, chars, owner (the user whose run made it)
        self._index: OrderedDict[str, tuple[int, int, int, str | None]] = OrderedDict()
        self._total = 0
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()

    def put(self, text: str, owner: str | None = None) -> str:
        data = text.encode("utf-8")
        with self._lock:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="tether-results-")  # noqa: SIM115 - lives as long as the store
            offset = self._file.seek(0, os.SEEK_END)
            self._file.write(data)
            handle = new_handle()
            self._index[handle] = (offset, len(data), len(text), owner)
            self._total += len(text)
            while self._total > self.max_total_chars and len(self._index) > 1:
                _, (_, _, chars, _) = self._index.popitem(last=False)
                self._total -= chars
            self._compact(offset + len(data))
        return handle

    def _compact(self, end: int) -> None:
        """Drop the forgotten prefix of the file once it outweighs what is still live. Oldest go
        first, so the live entries are always one run at the end of the file."""
        assert self._file is not None
        start = next(iter(self._index.values()))[0]
        if start <= end - start:
            return
        self._file.seek(start)
        live = self._file.read(end - start)
        fresh = tempfile.TemporaryFile(prefix="tether-results-")  # noqa: SIM115 - lives as long as the store
        fresh.write(live)
        self._file.close()
        self._file = fresh
        for handle, (offset, nbytes, chars, owner) in self._index.items():
            self._index[handle] = (offset - start, nbytes, chars, owner)

    @property
    def file_bytes(self) -> int:
        """Bytes the store keeps on disk (live results plus at most as many forgotten ones)."""
        with self._lock:
            return 0 if self._file is None else self._file.seek(0, os.SEEK_END)

    def get(self, handle: str, owner: str | None = None) -> str | None:
        """The text under `handle`, if `owner`'s run made it."""
        with self._lock:
            where = self._index.get(handle)
            if where is None or self._file is None or where[3] != owner:
                return None
            self._file.seek(where[0])
            return self._file.read(where[1]).decode("utf-8")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            self._index.clear()
            self._total = 0

    def __len__(self) -> int:
        return len(self._index)

    @property
    def total_chars(self) -> int:
        return self._total


def cap(text: str, limit: int, store: Results, owner: str | None = None) -> tuple[str, str | None]:
    """Cut `text` to `limit` characters; when cut, keep the whole under a handle and say how to page."""
    if len(text) <= limit:
        return text, None
    handle = store.put(text, owner)
    shown = text[:limit]
    note = (
        f"\n[truncated: showing characters 0-{limit} of {len(text)}. For more call "
        f"read_result(handle=\"{handle}\", offset={limit}, length={limit}).]"
    )
    return shown + note, handle


def read_result_tool(store: Results, max_chars: int = DEFAULT_MAX_RESULT_CHARS) -> Tool:
    """The built-in `read_result(handle, offset, length)` over one store. A run reads only the
    handles in its own RunState (made by its own calls, for its own user)."""

    @tool(name="read_result", effect="read_only")
    def read_result(context: ToolContext, handle: str, offset: int = 0, length: int = max_chars) -> str:
        """Read part of a tool result that was truncated.

        Args:
            handle: the handle named in the truncation note, e.g. "r_1f0c..."
            offset: first character to return
            length: how many characters to return (at most the result cap)
        """
        owned = context.run.handles or ()
        text = store.get(handle, context.user) if handle in owned else None
        if text is None:
            raise InvalidInput(f"no stored result under handle {handle!r} (unknown or expired)")
        if offset < 0 or offset >= len(text):
            raise InvalidInput(f"offset {offset} is outside the result (0-{len(text) - 1})")
        length = max(1, min(length, max_chars))
        end = min(len(text), offset + length)
        more = f" Next: offset={end}." if end < len(text) else " End of result."
        return f"{text[offset:end]}\n[characters {offset}-{end} of {len(text)}.{more}]"

    read_result.max_result_chars = max_chars + 200  # the page plus its footer is never re-capped
    return read_result
