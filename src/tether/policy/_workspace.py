"""The workspace's secret-bearing files, known by value before any tool runs.

At a run's start tether reads the files of the workspace whose name says they hold secrets
(`secret_file`: `.env`, `id_rsa`, `server.key`, ...) and takes their values as a read of each would
(`values_in`, with its length and variety rule). Then an output holding one of those values, or one of
its exact encodings (`encodings`), came from that file whatever the command's text said
(`cat $(printf '\\x2eenv')`, `cat x` after `cp .env x`), and the answer filter redacts them.

Bounded: at most MAX_DEPTH directories deep, MAX_ENTRIES names looked at, MAX_FILE_BYTES per file,
MAX_FILES secret files; `.git`, `node_modules`, virtual environments and caches are skipped, and a
symbolic link is read only when it points inside the workspace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tether.policy._leaks import _ASCII_INVISIBLE, _skeleton, encodings, secret_file, values_in

MAX_DEPTH = 6
MAX_ENTRIES = 20_000
MAX_FILE_BYTES = 256 * 1024
MAX_FILES = 50
MAX_VALUES = 500  # as the run's own set (tether.policy._policy.MAX_SECRETS)
_SKIP = frozenset({".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".nox",
                   ".mypy_cache", ".ruff_cache", ".pytest_cache", ".cache"})
# what the skeleton drops from an ASCII text (whitespace, controls): deleted in one C call
_ASCII_DROP = {**_ASCII_INVISIBLE, **dict.fromkeys(map(ord, " \t\n\r\x0b\x0c\x7f"))}


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
    except (OSError, ValueError):
        return False
    return True


def secret_files_in(root: Path) -> list[Path]:
    """The secret-bearing files under `root` (by name, `secret_file`), within the bounds above."""
    root = root.resolve()
    found: list[Path] = []
    seen = 0
    for top, dirs, files in os.walk(root, followlinks=False):
        depth = len(Path(top).relative_to(root).parts)
        dirs[:] = [] if depth >= MAX_DEPTH else sorted(d for d in dirs if d not in _SKIP)
        for name in sorted(files):
            seen += 1
            if seen > MAX_ENTRIES or len(found) >= MAX_FILES:
                return found
            path = Path(top, name)
            if secret_file(name) is None or (path.is_symlink() and not _inside(path, root)):
                continue
            try:
                if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                    found.append(path)
            except OSError:
                continue
        seen += len(dirs)
    return found


def workspace_secrets(root: Path) -> dict[str, str]:
    """The secret values of the workspace's secret-bearing files (value -> the file, relative to `root`)."""
    root = root.resolve()
    out: dict[str, str] = {}
    for path in secret_files_in(root):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        source = path.relative_to(root).as_posix()
        for value in values_in(text, path.name):
            if len(out) >= MAX_VALUES:
                return out
            out.setdefault(value, source)
    return out


class SecretMatcher:
    """One precomputed index of a set of secret values and all their encodings (`encodings`), made once
    per set: an output is searched once, whatever the number of values or turns.

    A found encoding is at least 8 characters long (`MIN_SECRET`), so any place it occurs covers a
    whole 8-character block of the text at a multiple of 8 when it is 15 characters or more, and a whole
    4-character block at a multiple of 4 otherwise: the text's blocks are looked up in a table of the
    encodings' blocks (set operations, n/8 + n/4 slices), and only a hit is compared in full."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.secrets = dict(secrets)
        source_of: dict[str, str] = {}
        for value, source in self.secrets.items():
            for key, _how in encodings(value):
                source_of.setdefault(key, source)
        # block -> (encoding, where the block starts in it)
        self._long: dict[str, list[tuple[str, int]]] = {}
        self._short: dict[str, list[tuple[str, int]]] = {}
        for key in source_of:
            size, table = (8, self._long) if len(key) >= 15 else (4, self._short)
            for j in range(min(size, len(key) - size + 1)):
                table.setdefault(key[j:j + size], []).append((key, j))
        self._source_of = source_of

    def source_in(self, text: str) -> str | None:
        """The file a value in `text` (or an encoding of it) was read from; None: it holds none."""
        if not text:
            return None
        # the skeleton `find_leaks` searches (whitespace and invisible characters gone, lower-cased)
        skel = text.translate(_ASCII_DROP).lower() if text.isascii() else _skeleton(text)[0]
        for size, table in ((8, self._long), (4, self._short)):
            if not table:
                continue
            for block in table.keys() & {skel[p:p + size] for p in range(0, len(skel) - size + 1, size)}:
                for p in _starts(skel, block, size):
                    for key, j in table[block]:
                        if p >= j and skel.startswith(key, p - j):
                            return self._source_of[key]
        return None


def _starts(text: str, block: str, size: int) -> list[int]:
    """Where `block` occurs in `text` at a multiple of `size`."""
    out = []
    at = text.find(block)
    while at != -1:
        if at % size == 0:
            out.append(at)
        at = text.find(block, at + 1)
    return out


def matcher_for(root: Path, last: SecretMatcher | None) -> SecretMatcher | None:
    """The matcher of `root`'s secret values now (`last` again when they are unchanged; None: it has
    none, and a run pays nothing per output)."""
    secrets = workspace_secrets(root)
    if not secrets:
        return None
    return last if last is not None and last.secrets == secrets else SecretMatcher(secrets)
__all__ = ["SecretMatcher", "matcher_for", "secret_files_in", "workspace_secrets"]
