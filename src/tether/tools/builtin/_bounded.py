"""Reading a file within ceilings: fixed-size chunks, at most a bounded slice of any one line held,
and per tool call a byte budget and a deadline, both checked between chunks.

A file's size says nothing about its lines: a 1.5 GB sparse file costs its maker nothing and is one
line of zeros, and a file another process keeps appending to never ends. So nothing here reads "a
line" or "the file"; it reads chunks, keeps what it was asked to keep, and stops when told to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

CHUNK_BYTES = 1 << 20


class ScanBudget:
    """How many bytes one tool call may read and how long it may take."""

    def __init__(self, max_bytes: int, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.seconds = seconds
        self.used = 0
        self._clock = clock
        self._end = clock() + seconds

    def take(self, n: int) -> None:
        self.used += n

    def room(self) -> int:
        """Bytes that may still be read."""
        return max(0, self.max_bytes - self.used)

    def late(self) -> str | None:
        """Why the call must stop for time now (None: it may go on)."""
        if self._clock() >= self._end:
            return f"it ran for its ceiling of {self.seconds:g} seconds"
        return None

    def spent(self) -> str | None:
        """Why the call must stop now, for bytes or time (None: it may go on)."""
        if self.used >= self.max_bytes:
            return f"it read its ceiling of {self.max_bytes:,} bytes"
        return self.late()


@dataclass(slots=True)
class Line:
    """One line's `head` (all of it, newline included, unless it was cut at the cap) and number."""

    number: int
    head: bytes
    ended: bool  # the head is the whole line (its newline, or the end of the file, was reached)


class Lines:
    """The lines of an open file, read from its current position in chunks of CHUNK_BYTES within
    `budget`; of any one line at most `cap` bytes (and its newline) are kept. `number` counts the
    lines passed whole; `stopped` says why reading ended before the end of the file (None: it did
    not end early)."""

    def __init__(self, fd: int, budget: ScanBudget, cap: int) -> None:
        self._fd = fd
        self._budget = budget
        self._cap = max(cap, 1)
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._midline = False  # bytes of an unfinished line were passed
        self.number = 0
        self.stopped: str | None = None

    def _fill(self) -> bool:
        """Whether there are unread bytes in the buffer (reading a chunk if needed); False at the end of
        the file or of the budget."""
        if self._pos < len(self._buf):
            return True
        if self._eof or self.stopped is not None:
            return False
        why = self._budget.spent()
        if why is not None:
            self.stopped = why
            return False
        data = os.read(self._fd, min(CHUNK_BYTES, self._budget.room()))
        self._budget.take(len(data))
        if not data:
            self._eof = True
            return False
        self._buf, self._pos = data, 0
        return True

    def skip(self, n: int) -> int:
        """Pass over the next `n` lines without keeping them; how many were passed (fewer at the end of
        the file, or of the budget)."""
        done = 0
        while done < n and self._fill():
            buf, pos = self._buf, self._pos
            found = buf.count(b"\n", pos)
            if done + found < n:
                done += found
                self._midline = buf[-1:] != b"\n"
                self._pos = len(buf)
                continue
            for _ in range(n - done):
                pos = buf.index(b"\n", pos) + 1
            self._pos = pos
            self._midline = False
            done = n
        if done < n and self._eof and self._midline:  # a last line without a newline
            done += 1
            self._midline = False
        self.number += done
        return done

    def next(self) -> Line | None:
        """The next line, with at most `cap` bytes of it read (None at the end). A cut line (`ended`
        False) must be finished with `rest_of_line` before the next one is asked for."""
        head = bytearray()
        while len(head) < self._cap and self._fill():
            buf, pos = self._buf, self._pos
            room = self._cap - len(head)
            nl = buf.find(b"\n", pos, pos + room)
            end = nl + 1 if nl >= 0 else min(len(buf), pos + room)
            head += buf[pos:end]
            self._pos = end
            if nl >= 0:
                self._midline = False
                self.number += 1
                return Line(self.number, bytes(head), True)
        if not head:
            return None
        if self._fill() and self._buf[self._pos] == 0x0A:  # exactly `cap` bytes, then its newline
            head += b"\n"
            self._pos += 1
        elif self._fill() or self.stopped is not None:
            self._midline = True
            return Line(self.number + 1, bytes(head), False)
        self._midline = False
        self.number += 1
        return Line(self.number, bytes(head), True)

    def rest_of_line(self) -> tuple[int, bool]:
        """Read on to the end of a line `next` cut: the bytes passed, and whether its end was reached."""
        passed = 0
        while self._fill():
            buf, pos = self._buf, self._pos
            nl = buf.find(b"\n", pos)
            if nl >= 0:
                passed += nl + 1 - pos
                self._pos = nl + 1
                break
            passed += len(buf) - pos
            self._pos = len(buf)
        else:
            if self.stopped is not None:
                return passed, False
        self._midline = False
        self.number += 1
        return passed, True

    def more(self) -> bool:
        """Whether any byte follows (False at the end of the file, or when the budget stopped reading:
        then `stopped` says so)."""
        return self._fill()


__all__ = ["CHUNK_BYTES", "Line", "Lines", "ScanBudget"]
