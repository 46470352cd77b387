"""File tools confined to a workspace root: Read, Write, Edit, Glob, Grep.

Names and parameters follow Claude Code (and the CodeCrafters "Build your own Claude Code" course),
so models trained on those tools use them without coaching.

Confinement: every path is resolved beneath the root by the kernel at the moment it is opened
(tools/_beneath.py: openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, else an O_NOFOLLOW descriptor
walk), never checked first and opened after; `../` escapes and absolute paths elsewhere are refused
with an error naming the root, and so is a symbolic link anywhere on the path (even one pointing
inside). Glob and Grep walk by directory descriptors and leave symbolic links out. Write and Edit
write a new file in the target's directory and rename it over the target (a hard link to a file
outside is replaced, not written through), and never write under `.git` or a `protect`ed path.

Hostile files and patterns meet ceilings (docs/cli.md, "The file tools"): Grep runs RE2 (linear time,
tools/builtin/_regex.py); a paged Read and Grep read within a byte budget and a deadline per call, in
chunks, holding at most a cut slice of any one line (tools/builtin/_bounded.py); a FIFO, socket or device
is refused by its type before it is opened for reading.

Read, Grep and Glob return text that someone other than the user may have written (cloned
repositories, downloads, files produced by earlier tool calls; even a file *name* can carry an
instruction), so their output is marked `untrusted_output`: the safety policy treats instructions
found there as data, not as the user's words. Write and Edit declare the path they write
(`writes_path`): after taint, content not traceable to the user needs approval, and a file written
from such content keeps the run's commands (Bash) under approval.
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from tether._errors import InvalidInput, OperationFailed
from tether.tools._base import Tool, files_source, tool, values_from
from tether.tools._beneath import Beneath, Entry, open_entry
from tether.tools.builtin._bounded import Lines, ScanBudget
from tether.tools.builtin._regex import SYNTAX, LinePattern, compile_pattern

if TYPE_CHECKING:
    from tether.staging import StagedWorkspace

MAX_FILE_BYTES = 5_000_000
MAX_GLOB_RESULTS = 200
MAX_GREP_MATCHES = 200
MAX_GREP_LINE_CHARS = 300
MAX_SCAN_ENTRIES = 100_000
DEFAULT_READ_LINES = 2_000
BINARY_SNIFF_BYTES = 8_192
MAX_LINE_BYTES = 20_000  # Read shows at most this much of one line
MAX_SCAN_BYTES = 256 << 20  # one Read or Grep call reads at most this much ...
MAX_CALL_SECONDS = 30.0  # ... and stops after this long (well inside the executor's 120 s)

# Directories walks skip unless the search starts inside one: VCS data, dependencies, caches.
SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".tox",
        ".mypy_cache", ".pytest_cache", ".ruff_cache",
    }
)  # fmt: skip


class Workspace:
    """A root directory and its files, reached only through `tether.tools._beneath` (resolved by the
    kernel at the moment of use, no symbolic link followed).

    With a `stage` (tether.staging.StagedWorkspace) the files are the run's staged view: paths are shown
    and taken as the real workspace's, writes go to the view (made at the first one: a run that only
    reads copies nothing) and reads too once it exists, and the directories the stage does not copy
    (`.git`, `.venv` ...) are read from the real workspace and never written."""

    def __init__(self, root: str | Path, *, stage: StagedWorkspace | None = None) -> None:
        given = Path(os.path.abspath(os.fspath(root if stage is None else stage.workspace)))
        real = given.resolve()
        if not real.is_dir():
            raise InvalidInput(f"workspace root {given} is not an existing directory")
        self.given_root = given
        self.shown = real  # the root as the model sees it (the real workspace, also when staged)
        self.stage = stage
        self._real = Beneath(real)
        self._view = None if stage is None else Beneath(stage.view)
        self.passthrough: dict[str, Beneath] = {}
        if stage is not None:
            self.passthrough = dict.fromkeys(stage.passthrough, self._real)

    @property
    def root(self) -> Path:
        """Where the files are now: the staged view once it exists, else the workspace itself."""
        return self.files.root

    @property
    def files(self) -> Beneath:
        if self._view is not None and self.stage is not None and self.stage.ready:
            return self._view
        return self._real

    def for_writing(self) -> Beneath:
        """Where a write goes: the staged view (made now if need be), or the workspace itself."""
        if self.stage is not None and self._view is not None:
            try:
                self.stage.make_view()
            except (InvalidInput, OperationFailed) as exc:
                raise OperationFailed(f"{exc}; nothing was written") from None
            return self._view
        return self._real

    def beneath(self, rel: str) -> Beneath:
        """Where the relative path `rel` is opened: the view, or the real workspace for a passthrough."""
        return self.passthrough.get(rel.split("/", 1)[0], self.files) if self.passthrough else self.files

    def relative(self, path: str, *, what: str = "path") -> str:
        """`path` (relative to the root, or absolute inside it) as a normalised relative path ('.' for
        the root); ValueError if it leaves the root. Lexical only: nothing on disk is looked at."""
        if not isinstance(path, str) or not path.strip():
            raise InvalidInput(f"{what} is empty; give a path relative to the workspace root {self.shown}")
        if "\0" in path:
            raise InvalidInput(f"{what} contains a NUL character")
        candidate = Path(path)
        root = self.root
        if candidate.is_absolute():  # the workspace as given or as resolved: mapped onto where the files are
            base = next((b for b in (self.given_root, self.shown) if b != root and _inside(candidate, b)), None)
            if base is not None:
                candidate = root / candidate.relative_to(base)
        lexical = Path(os.path.normpath(root / candidate))
        if not _inside(lexical, root):
            raise InvalidInput(
                f"{what} '{path}' is outside the workspace root {self.shown}; "
                "use a path relative to the root or an absolute path inside it"
            )
        return lexical.relative_to(root).as_posix() or "."

    def error(self, exc: OSError, path: str, action: str) -> ValueError:
        """The message the model sees for a failed open/replace of `path`."""
        code = exc.errno
        if code in (errno.ELOOP, errno.EXDEV):
            return ValueError(
                f"'{path}' passes through a symbolic link (or was swapped for one); the file tools do not "
                f"follow symbolic links, so refusing. Use the link's target path inside {self.shown}"
            )
        if code == errno.ENOENT:
            return ValueError(f"file not found: '{path}' (workspace root {self.shown}); use Glob to find files")
        if code == errno.ENOTDIR and self._symlink_on_the_way(path):  # O_NOFOLLOW|O_DIRECTORY on a link
            return self.error(OSError(errno.ELOOP, "symbolic link"), path, action)
        if code == errno.ENOTDIR:
            return ValueError(f"cannot {action} '{path}': a part of the path is a file, not a directory")
        if code == errno.EISDIR:
            return ValueError(f"'{path}' is a directory, not a file; use Glob to list its contents")
        return ValueError(f"cannot {action} '{path}': {exc.strerror or exc}")

    def _symlink_on_the_way(self, path: str) -> bool:
        """Whether a component of `path` is a symbolic link now (for the message only: decisions are
        made by the open itself)."""
        try:
            rel = self.relative(path)
        except ValueError:
            return False
        here = self.root
        for part in rel.split("/"):
            here = here / part
            if here.is_symlink():
                return True
        return False

    def open_file(self, path: str, *, what: str = "file_path") -> tuple[int, os.stat_result, str]:
        """An open read descriptor of the existing regular file `path`, its stat and its shown name."""
        rel = self.relative(path, what=what)
        try:
            fd = self.beneath(rel).open_regular(rel)  # a FIFO, socket or device is refused without being opened
        except OSError as exc:
            raise self.error(exc, path, "read") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            if stat.S_ISDIR(info.st_mode):
                raise InvalidInput(f"'{path}' is a directory, not a file; use Glob to list its contents")
            raise InvalidInput(f"'{path}' is not a regular file")
        return fd, info, rel

    def walk(self, dir_fd: int, prefix: str, *, max_depth: int | None = None) -> Iterator[Entry]:
        """Entries under the open directory `dir_fd` (path `prefix`), sorted, SKIP_DIRS and symbolic
        links left out."""
        return self.files.walk(dir_fd, prefix, max_depth=max_depth, skip_dirs=SKIP_DIRS)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _is_binary(head: bytes) -> bool:
    return b"\0" in head


def _read_all(fd: int, info: os.stat_result, shown: str, *, max_bytes: int, strict: bool = False) -> str:
    """The whole text of the open file `fd` (closed here)."""
    with os.fdopen(fd, "rb") as fh:
        if info.st_size > max_bytes:
            raise InvalidInput(
                f"'{shown}' is {info.st_size:,} bytes, over the {max_bytes:,}-byte limit for reading a whole file; "
                "read part of it with offset and limit"
            )
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since the stat
        raise InvalidInput(f"'{shown}' is over the {max_bytes:,}-byte limit for reading a whole file")
    if _is_binary(data[:BINARY_SNIFF_BYTES]):
        raise InvalidInput(
            f"'{shown}' looks like a binary file (it contains NUL bytes); only text files can be read"
        )
    if strict:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"'{shown}' is not valid UTF-8 text; it cannot be edited safely") from None
    return data.decode("utf-8", errors="replace")


# --- glob patterns -----------------------------------------------------------------------------


def expand_braces(pattern: str, limit: int = 64) -> list[str]:
    """`*.{py,md}` -> [`*.py`, `*.md`] (nested groups too), at most `limit` patterns."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    depth = 0
    parts: list[str] = []
    last = start + 1
    for i in range(start, len(pattern)):
        ch = pattern[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                parts.append(pattern[last:i])
                prefix, suffix = pattern[:start], pattern[i + 1 :]
                out: list[str] = []
                for part in parts:
                    for tail in expand_braces(prefix + part + suffix, limit):
                        out.append(tail)
                        if len(out) > limit:
                            raise InvalidInput(f"glob pattern expands to more than {limit} alternatives")
                return out
        elif ch == "," and depth == 1:
            parts.append(pattern[last:i])
            last = i + 1
    return [pattern]  # unbalanced brace: treat literally


class GlobPattern:
    """A glob matched against '/'-separated relative paths.

    `*`, `?` and `[...]` match within one path segment (via `fnmatch`, whose regexes use atomic
    groups, so patterns like `*a*a*a*b` cannot backtrack for long); `**` as a whole segment matches
    any number of segments, including none; `{a,b}` alternatives are expanded first.
    """

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.alternatives: list[list[re.Pattern[str] | None]] = []
        for expanded in expand_braces(pattern):
            segments: list[re.Pattern[str] | None] = []
            for segment in expanded.split("/"):
                if segment in ("", "."):
                    continue
                if segment == "**":
                    if not segments or segments[-1] is not None:  # '**/**' is the same as '**'
                        segments.append(None)
                    continue
                try:
                    segments.append(re.compile(fnmatch.translate(segment)))
                except re.error as exc:
                    raise InvalidInput(f"invalid glob pattern {pattern!r}: {exc}") from None
            self.alternatives.append(segments)

    @property
    def max_depth(self) -> int | None:
        """How many segments deep a match can be (None when `**` makes it unbounded)."""
        if any(None in segments for segments in self.alternatives):
            return None
        return max((len(segments) for segments in self.alternatives), default=0)

    def match(self, path: str) -> bool:
        parts = path.split("/")
        return any(_match_segments(segments, parts) for segments in self.alternatives)


def _match_segments(segments: list[re.Pattern[str] | None], parts: list[str]) -> bool:
    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        key = (i, j)
        if key not in memo:
            if i == len(segments):
                memo[key] = j == len(parts)
            elif segments[i] is None:
                memo[key] = any(match(i + 1, k) for k in range(j, len(parts) + 1))
            else:
                seg = segments[i]
                memo[key] = (
                    j < len(parts) and seg is not None and bool(seg.match(parts[j])) and match(i + 1, j + 1)
                )
        return memo[key]

    return match(0, 0)


def _check_pattern(pattern: str, what: str) -> None:
    if not pattern.strip():
        raise InvalidInput(f"{what} is empty; e.g. '**/*.py'")
    if pattern.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", pattern):
        raise InvalidInput(
            f"{what} must be relative (e.g. '**/*.py'); use the path parameter to choose a directory"
        )
    if ".." in pattern.split("/"):
        raise InvalidInput(f"{what} must not contain '..'; use the path parameter to choose a directory")


# --- tools ---------------------------------------------------------------------------------------


def read_tool(root: str | Path, *, max_file_bytes: int = MAX_FILE_BYTES, max_line_bytes: int = MAX_LINE_BYTES,
              max_scan_bytes: int = MAX_SCAN_BYTES, max_seconds: float = MAX_CALL_SECONDS,
              stage: StagedWorkspace | None = None) -> Tool:
    """The `Read` tool for files under `root` (its staged view with a `stage`): a whole file up to
    `max_file_bytes`; a part (offset, limit) of any file, its lines cut at `max_line_bytes`, reading at
    most `max_scan_bytes` for at most `max_seconds` per call."""
    ws = Workspace(root, stage=stage)

    def Read(
        file_path: str,
        offset: Annotated[int, Field(ge=0)] | None = None,
        limit: Annotated[int, Field(ge=1)] | None = None,
    ) -> str:
        """Read a text file.

        Args:
            file_path: path of the file, relative to the workspace root or absolute inside it
            offset: 1-based line number to start reading at (only for reading part of a long file)
            limit: maximum number of lines to return (only for reading part of a long file)
        """
        fd, info, shown = ws.open_file(file_path)
        if offset is None and limit is None:
            return _read_all(fd, info, shown, max_bytes=max_file_bytes)
        try:
            return _read_lines(fd, info, shown, max(offset or 1, 1), limit or DEFAULT_READ_LINES,
                               max_bytes=max_file_bytes, max_line=min(max_line_bytes, max_file_bytes),
                               budget=ScanBudget(max_scan_bytes, max_seconds))
        finally:
            os.close(fd)

    read = tool(
        name="Read",
        description=(
            "Read a text file and return its exact contents. For a long file, pass offset (1-based start "
            f"line) and limit (number of lines) to read a part; then a line over {max_line_bytes:,} bytes is "
            f"cut, with a note. Workspace root: {ws.shown}"
        ),
        effect="read_only",
        untrusted_output=True,
    )(Read)
    # A grammar-constrained model picks file_path from the workspace's files (when there are few).
    return values_from(read, "file_path", files_source(ws.root))


def _read_lines(fd: int, info: os.stat_result, shown: str, start: int, count: int, *, max_bytes: int,
                max_line: int, budget: ScanBudget) -> str:
    """Lines `start`.. of the open file `fd` (the caller's), `count` at most and `max_bytes` of text at
    most, each cut at `max_line` bytes; the file is read in chunks within `budget`, so no more than one
    chunk and one cut line are held, whatever the file is."""
    binary = (f"'{shown}' looks like a binary file (it contains NUL bytes{{}}); only text files can be read")
    if _is_binary(os.pread(fd, BINARY_SNIFF_BYTES, 0)):
        raise InvalidInput(binary.format(""))
    lines = Lines(fd, budget, max_line)
    if lines.skip(start - 1) < start - 1:
        if lines.stopped is not None:
            raise InvalidInput(
                f"offset {start} is out of Read's reach in '{shown}' ({info.st_size:,} bytes): Read stopped "
                f"after {lines.number:,} whole lines and {budget.used:,} bytes because {lines.stopped}; lines "
                "this far in are out of the file tools' reach. Read an earlier part"
            )
        if lines.number == 0:
            return ""
        raise InvalidInput(f"offset {start} is past the end of '{shown}', which has {lines.number:,} lines")
    parts: list[str] = []
    used = 0
    last = start - 1
    end_note = ""
    while last - start + 1 < count and used < max_bytes:
        line = lines.next()
        if line is None:
            break
        if b"\0" in line.head:
            raise InvalidInput(binary.format(f" on line {line.number:,}"))
        if used and used + len(line.head) > max_bytes:  # shown from the next call on
            end_note = f"more follow: continue with offset={line.number}"
            break
        text = _decode_head(line.head, line.ended)
        used += len(line.head)
        last = line.number
        if line.ended:
            parts.append(text)
            continue
        passed, ended = lines.rest_of_line()
        whole = len(line.head) + passed
        parts.append(text + "\n" + (
            f"[line {line.number:,} cut: {len(line.head):,} of its {whole:,} bytes shown]\n" if ended else
            f"[line {line.number:,} cut: {len(line.head):,} bytes shown; Read passed {whole:,} bytes of it "
            f"and stopped before its end because {lines.stopped}]\n"))
        if not ended:
            end_note = "no more can be read in one call"
            break
    if not parts:
        if lines.stopped is not None:
            raise InvalidInput(f"Read stopped before line {start} of '{shown}' because {lines.stopped}")
        if lines.number == 0:
            return ""
        raise InvalidInput(f"offset {start} is past the end of '{shown}', which has {lines.number:,} lines")
    if not end_note and lines.more():
        end_note = f"more follow: continue with offset={last + 1}"
    elif not end_note and lines.stopped is not None:
        end_note = f"Read stopped there because {lines.stopped}; the lines after may be out of its reach"
    text = "".join(parts)
    if end_note:
        text += ("" if text.endswith("\n") else "\n") + f"[lines {start}-{last} shown; {end_note}]"
    return text


def _decode_head(head: bytes, whole: bool) -> str:
    """A line's text; a head cut inside a UTF-8 character loses that character's first bytes."""
    if whole:
        return head.decode("utf-8", errors="replace")
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)


def _check_writable(shown: str, file_path: str, protect: Sequence[str]) -> None:
    """Refuse a write under `.git` (at any depth) or a `protect`ed path: code there runs later,
    outside any sandbox (hooks, core.fsmonitor, direnv ...). `shown` is already normalised and no
    symbolic link is followed on the way, so the lexical path is the path written."""
    parts = shown.split("/")
    hit = ".git" if ".git" in parts else next(
        (p for p in protect if shown == p or shown.startswith(p.rstrip("/") + "/")), None)
    if hit is not None:
        raise InvalidInput(f"'{file_path}' is under {hit}, which the file tools do not write: code there runs "
                         "later, outside the sandbox")


def write_tool(root: str | Path, *, protect: Sequence[str] = (), stage: StagedWorkspace | None = None) -> Tool:
    """The `Write` tool for files under `root` (never under `.git` or a `protect`ed path); with a
    `stage`, it writes the run's staged view, and the call needs no approval (see tether.staging)."""
    ws = Workspace(root, stage=stage)
    protected = [os.path.normpath(p) for p in (*protect, *ws.passthrough)]

    def Write(file_path: str, content: str) -> str:
        """Write a file.

        Args:
            file_path: path of the file, relative to the workspace root or absolute inside it
            content: the complete new contents of the file
        """
        shown = ws.relative(file_path, what="file_path")
        if shown == ".":
            raise InvalidInput(f"'{file_path}' is a directory; give a file path")
        _check_writable(shown, file_path, protected)
        try:
            existed = ws.for_writing().replace(shown, content.encode("utf-8"), create_dirs=True)
        except OSError as exc:
            raise ws.error(exc, file_path, "write") from None
        lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        verb = "Overwrote" if existed else "Created"
        return f"{verb} {shown} ({lines} line{'' if lines == 1 else 's'}, {len(content)} characters)"

    return tool(
        name="Write",
        description=(
            "Write a file (create it, or replace all of its contents); parent directories are created. "
            f"Prefer Edit for changing part of an existing file. Workspace root: {ws.shown}"
        ),
        effect="reversible",
        writes_path="file_path", staged=stage is not None,
        metadata={"writes_path": "file_path", "staged": stage is not None},  # the same, as read before `declared`
    )(Write)


def edit_tool(root: str | Path, *, max_file_bytes: int = MAX_FILE_BYTES, protect: Sequence[str] = (),
              stage: StagedWorkspace | None = None) -> Tool:
    """The `Edit` tool for files under `root` (never under `.git` or a `protect`ed path); staged like
    `write_tool` with a `stage`."""
    ws = Workspace(root, stage=stage)
    protected = [os.path.normpath(p) for p in (*protect, *ws.passthrough)]

    def Edit(file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> str:
        """Replace exact text in a file.

        Args:
            file_path: path of the file, relative to the workspace root or absolute inside it
            old_string: the exact text to replace, including whitespace and indentation
            new_string: the text to put in its place
            replace_all: replace every occurrence instead of requiring exactly one
        """
        if old_string == "":
            raise InvalidInput("old_string is empty; to create or overwrite a file use Write")
        if old_string == new_string:
            raise InvalidInput("old_string and new_string are identical; nothing to change")
        _check_writable(ws.relative(file_path, what="file_path"), file_path, protected)
        fd, info, shown = ws.open_file(file_path)
        text = _read_all(fd, info, shown, max_bytes=max_file_bytes, strict=True)
        count = text.count(old_string)
        if count == 0:
            raise InvalidInput(
                f"old_string was not found in '{shown}' (0 matches); Read the file and copy the text exactly, "
                "including whitespace and indentation"
            )
        if count > 1 and not replace_all:
            raise InvalidInput(
                f"old_string matches {count} places in '{shown}'; include more surrounding lines to make it "
                "unique, or set replace_all to true to replace every occurrence"
            )
        updated = text.replace(old_string, new_string)
        try:
            ws.for_writing().replace(shown, updated.encode("utf-8"), must_exist=True)
        except OSError as exc:
            raise ws.error(exc, file_path, "write") from None
        return f"Replaced {count} occurrence{'s' if count != 1 else ''} in {shown}"

    return tool(
        name="Edit",
        description=(
            "Replace exact text in a file. old_string must match the file exactly and, unless replace_all "
            f"is true, exactly once. Read the file first. Workspace root: {ws.shown}"
        ),
        effect="reversible",
        writes_path="file_path", staged=stage is not None,
        metadata={"writes_path": "file_path", "staged": stage is not None},  # the same, as read before `declared`
    )(Edit)


def _search_base(ws: Workspace, path: str | None) -> tuple[int, os.stat_result, str]:
    """An open descriptor of the directory or file to search, its stat and its shown path."""
    rel = "." if path is None or path.strip() in ("", ".") else ws.relative(path)
    try:
        fd = ws.beneath(rel).open_regular(rel, allow_dir=True)  # a FIFO, socket or device: refused unopened
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise InvalidInput(f"path not found: '{path}' (workspace root {ws.shown})") from None
        raise ws.error(exc, path or ".", "open") from None
    return fd, os.fstat(fd), rel


def glob_tool(root: str | Path, *, max_results: int = MAX_GLOB_RESULTS, stage: StagedWorkspace | None = None) -> Tool:
    """The `Glob` tool for files under `root` (its staged view with a `stage`)."""
    ws = Workspace(root, stage=stage)

    def Glob(pattern: str, path: str | None = None) -> str:
        """Find files by glob pattern.

        Args:
            pattern: glob such as '**/*.py', 'src/*.{ts,tsx}' or 'README*'; '**' matches any number of directories
            path: directory to search in, relative to the workspace root (default: the root)
        """
        _check_pattern(pattern, "pattern")
        matcher = GlobPattern(pattern)
        base_fd, info, base = _search_base(ws, path)
        matches: list[str] = []
        scanned = 0
        try:
            if not stat.S_ISDIR(info.st_mode):
                raise InvalidInput(f"path '{path}' is a file, not a directory")
            skip = len(base) + 1 if base != "." else 0
            for entry in ws.walk(base_fd, base, max_depth=matcher.max_depth):
                scanned += 1
                if scanned > MAX_SCAN_ENTRIES:
                    break
                if matcher.match(entry.path[skip:]):
                    matches.append(entry.path + ("/" if entry.is_dir else ""))
        finally:
            os.close(base_fd)
        if not matches:
            return f"No files match '{pattern}' in {base}"
        matches.sort()
        lines = matches[:max_results]
        if len(matches) > max_results:
            lines.append(f"[{len(matches) - max_results} more not shown; use a narrower pattern or path]")
        if scanned > MAX_SCAN_ENTRIES:
            lines.append(f"[stopped after scanning {MAX_SCAN_ENTRIES:,} entries; use a narrower path]")
        return "\n".join(lines)

    return tool(
        name="Glob",
        description=(
            "Find files and directories by glob pattern. Returns paths relative to the workspace root, sorted; "
            f"directories end with '/'. Skips .git, node_modules, virtualenvs and caches. Workspace root: {ws.shown}"
        ),
        effect="read_only",
        untrusted_output=True,
    )(Glob)


def grep_tool(
    root: str | Path, *, max_matches: int = MAX_GREP_MATCHES, max_file_bytes: int = MAX_FILE_BYTES,
    max_scan_bytes: int = MAX_SCAN_BYTES, max_seconds: float = MAX_CALL_SECONDS,
    stage: StagedWorkspace | None = None,
) -> Tool:
    """The `Grep` tool for files under `root` (its staged view with a `stage`): RE2 patterns (linear
    time), files up to `max_file_bytes`, reading at most `max_scan_bytes` for at most `max_seconds` per call."""
    ws = Workspace(root, stage=stage)

    def Grep(pattern: str, path: str | None = None, glob: str | None = None) -> str:
        """Search file contents.

        Args:
            pattern: regular expression searched in each line (RE2: Python's re syntax without backreferences or lookaround), e.g. 'def \\w+_tool' or '(?i)todo'
            path: file or directory to search, relative to the workspace root (default: the root)
            glob: only search files matching this glob, e.g. '*.py' (file name) or 'src/**/*.ts' (path)
        """
        regex = compile_pattern(pattern)
        if glob is not None:
            _check_pattern(glob, "glob")
        glob_filter = GlobPattern(glob) if glob else None
        by_name = glob is not None and "/" not in glob
        base_fd, info, base = _search_base(ws, path)
        search = _Search(regex, max_matches, max_file_bytes, ScanBudget(max_scan_bytes, max_seconds))
        try:
            if not stat.S_ISDIR(info.st_mode):  # one regular file, already open
                search.file(base_fd, base)
            else:
                skip = len(base) + 1 if base != "." else 0
                for entry in ws.walk(base_fd, base):
                    if not search.go_on():
                        break
                    if entry.is_dir or not entry.is_file:  # FIFOs, sockets, devices: never opened
                        continue
                    if glob_filter is not None:
                        subject = entry.name if by_name else entry.path[skip:]
                        if not glob_filter.match(subject):
                            continue
                    try:
                        fd = open_entry(entry)
                    except OSError:  # gone, or swapped for a symbolic link, since it was listed
                        continue
                    try:
                        if not search.file(fd, entry.path):
                            break
                    finally:
                        os.close(fd)
        finally:
            os.close(base_fd)
        return search.report(pattern, base)

    return tool(
        name="Grep",
        description=(
            f"Search file contents with a regular expression ({SYNTAX}). Returns 'path:line:text' lines, "
            "paths relative to the workspace root. Binary files, files over "
            f"{max_file_bytes:,} bytes, .git, node_modules, virtualenvs and caches are skipped. "
            f"Workspace root: {ws.shown}"
        ),
        effect="read_only",
        untrusted_output=True,
    )(Grep)


class _Search:
    """One Grep call: its matches, the files it passed over, and why it stopped early (if it did)."""

    def __init__(self, pattern: LinePattern, max_matches: int, max_file_bytes: int, budget: ScanBudget) -> None:
        self.pattern = pattern
        self.max_matches = max_matches
        self.max_file_bytes = max_file_bytes
        self.budget = budget
        self.out: list[str] = []
        self.too_big: list[str] = []
        self.searched = 0
        self.capped = False
        self.stopped: str | None = None

    def go_on(self) -> bool:
        """Whether the search may go on to the next file (False once the time is up)."""
        if self.stopped is None:
            self.stopped = self.budget.late()
        return self.stopped is None and not self.capped

    def file(self, fd: int, shown: str) -> bool:
        """Add the matches of the open file `fd` (the caller's; non-regular, oversized and binary files
        are passed over); False once the search must stop."""
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return True
            if info.st_size > self.max_file_bytes:
                self.too_big.append(shown)
                return True
            if info.st_size > self.budget.room():
                self.stopped = self.budget.spent() or f"the next file would pass its ceiling of " \
                    f"{self.budget.max_bytes:,} bytes read"
                return False
            data = os.pread(fd, min(self.max_file_bytes, self.budget.room()) + 1, 0)  # may have grown
        except OSError:
            return True
        self.budget.take(len(data))
        if len(data) > self.max_file_bytes:
            self.too_big.append(shown)
            return True
        if _is_binary(data[:BINARY_SNIFF_BYTES]):
            return True
        self.searched += 1
        for number, line in self.pattern.lines(data, self.go_on):
            if len(self.out) >= self.max_matches:
                self.capped = True
                return False
            self.out.append(f"{shown}:{number}:{_grep_line(line)}")
        return self.stopped is None

    def report(self, pattern: str, base: str) -> str:
        lines = self.out or [f"No matches for {pattern!r} in {base}"]
        if self.capped:
            lines.append(f"[stopped at {self.max_matches} matches; narrow the pattern, path or glob]")
        if self.too_big:
            some = ", ".join(f"'{p}'" for p in self.too_big[:3]) + (", ..." if len(self.too_big) > 3 else "")
            lines.append(f"[not searched: {len(self.too_big)} file(s) over {self.max_file_bytes:,} bytes ({some}); "
                         "Read them in parts with offset and limit]")
        if self.stopped is not None:
            lines.append(f"[stopped early after searching {self.searched} file(s), because {self.stopped}; the "
                         "rest was not searched: narrow the path or glob]")
        return "\n".join(lines)


def _grep_line(line: bytes) -> str:
    """A matching line as shown: at most MAX_GREP_LINE_CHARS characters."""
    text = line[: MAX_GREP_LINE_CHARS * 4].decode("utf-8", errors="replace")
    if len(text) > MAX_GREP_LINE_CHARS or len(line) > MAX_GREP_LINE_CHARS * 4:
        text = text[:MAX_GREP_LINE_CHARS] + "..."
    return text


def file_tools(root: str | Path, *, read_only: bool = False, protect: Sequence[str] = (),
               stage: StagedWorkspace | None = None) -> list[Tool]:
    """Read, Write, Edit, Glob and Grep confined to `root` (only Read, Glob, Grep when read_only);
    Write and Edit never write under `.git` or a `protect`ed path. With a `stage` (tether.staging)
    they work in the run's staged view of `root`: writes need no approval and are reviewed at the end."""
    readers = [read_tool(root, stage=stage), glob_tool(root, stage=stage), grep_tool(root, stage=stage)]
    if read_only:
        return readers
    return [readers[0], write_tool(root, protect=protect, stage=stage), edit_tool(root, protect=protect, stage=stage),
            *readers[1:]]


__all__ = [
    "GlobPattern",
    "Workspace",
    "edit_tool",
    "file_tools",
    "glob_tool",
    "grep_tool",
    "read_tool",
    "write_tool",
]
