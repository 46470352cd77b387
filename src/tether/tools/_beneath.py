"""Open, replace and walk files beneath a directory, resolving each path at the moment of use.

A check on a path followed by an `open` of the same path is a race: between the two, anything that
can write inside the directory (a sandboxed command running in the same turn) can swap a directory
for a symbolic link to somewhere else, and the open lands there. So nothing here resolves a path
and then opens it; the kernel resolves it during the open, refusing to leave the directory:

- `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` (Linux 5.6+),
  called through `syscall(2)` since Python has no binding;
- elsewhere (older kernels, seccomp filters that refuse it), a walk one component at a time, each
  `openat` relative to the directory descriptor of the previous one, with `O_NOFOLLOW`.

Either way a symbolic link anywhere in the path is refused (`ELOOP`), even one that points inside.
Writes go to a new file in the target's directory (through that directory's descriptor) that is then
renamed over the target, so a target that is a hard link to a file outside leaves that file alone.
Walks hold a descriptor per directory level and open each entry relative to it with `O_NOFOLLOW`.
Reads open regular files only: `open_regular` looks at the type through an `O_PATH` descriptor first
(a FIFO would block the open, a device can act on it), walked entries carry the directory listing's
type, and every read open is `O_NONBLOCK | O_NOCTTY` in case the path was swapped in between.

Paths given here are already lexically relative ("a/b/c" or "."), without ".." (the caller's job:
`tether.tools.builtin._files.Workspace.relative`); the root itself is opened by its real path,
chosen by the user, whose ancestors the sandbox keeps read-only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SYS_OPENAT2 = 437  # the same number on every Linux architecture (added after the syscall tables merged)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_PATH = getattr(os, "O_PATH", 0)
DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# NONBLOCK: a FIFO does not hang the open; NOCTTY: a terminal device does not become ours
READ_FLAGS = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _NOCTTY | _CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _libc_syscall() -> Any:  # a ctypes function
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_syscall = _libc_syscall()
# None: not probed yet; tests set it to False to exercise the descriptor walk.
use_openat2: bool | None = None


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE)
    assert _syscall is not None
    fd = _syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(path)),
                  ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def openat2_available(dir_fd: int) -> bool:
    """Whether this kernel (and any seccomp filter around us) lets openat2 through (probed once)."""
    global use_openat2
    if use_openat2 is None:
        if _syscall is None or not hasattr(os, "O_PATH"):
            use_openat2 = False
        else:
            try:
                os.close(_openat2(dir_fd, ".", os.O_PATH | _CLOEXEC, 0))
                use_openat2 = True
            except OSError as exc:
                use_openat2 = exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG)
    return use_openat2


def _walk_open(dir_fd: int, path: str, flags: int, mode: int) -> int:
    """openat one component at a time from `dir_fd`, never following a symbolic link."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or any(p == ".." for p in parts):
        raise OSError(errno.EXDEV, "path leaves the directory", path)
    if not parts:
        return os.open(".", flags | _CLOEXEC, mode, dir_fd=dir_fd)
    cur = dir_fd
    try:
        for part in parts[:-1]:
            nxt = os.open(part, DIR_FLAGS, dir_fd=cur)
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        return os.open(parts[-1], flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=cur)
    finally:
        if cur != dir_fd:
            os.close(cur)


def open_beneath(dir_fd: int, path: str, flags: int, mode: int = 0o666) -> int:
    """A descriptor for `path` resolved beneath the directory `dir_fd`, no symbolic link followed.

    Raises OSError: ELOOP for a symbolic link on the way, EXDEV for an escape, as `open` otherwise.
    """
    if "\0" in path:
        raise OSError(errno.EINVAL, "NUL in path", path)
    if openat2_available(dir_fd):
        for _ in range(8):
            try:
                return _openat2(dir_fd, path or ".", flags | _CLOEXEC, mode)
            except OSError as exc:  # EAGAIN: a concurrent rename made the kernel unsure; ask again
                if exc.errno != errno.EAGAIN:
                    raise
        raise OSError(errno.EAGAIN, "the path kept changing while it was resolved", path)
    return _walk_open(dir_fd, path, flags, mode)


@dataclass(slots=True)
class Entry:
    """One walked name: `path` relative to the root ('/'-separated), its directory's descriptor
    (valid until the walk moves on), its own name in that directory and whether it is a regular file."""

    path: str
    is_dir: bool
    dir_fd: int
    name: str
    is_file: bool = True  # a regular file, as the directory listing says (FIFOs and devices are not)


class Beneath:
    """A root directory whose files are opened, replaced and walked without leaving it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _root_fd(self) -> int:
        return os.open(self.root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)

    def open(self, path: str, flags: int = READ_FLAGS, mode: int = 0o666) -> int:
        """`open_beneath` from the root."""
        root = self._root_fd()
        try:
            return open_beneath(root, path, flags, mode)
        finally:
            os.close(root)

    def open_regular(self, path: str, *, allow_dir: bool = False) -> int:
        """A read descriptor of the regular file `path` (or directory, with `allow_dir`). Its type is
        looked at through an `O_PATH` descriptor first, so a FIFO, socket or device is refused without
        being opened for reading (which can block, fail oddly or have side effects); the descriptor
        opened after is checked again (the path may have changed in between).

        Raises OSError: EINVAL naming what else it is, EISDIR for a directory, ELOOP for a link.
        """
        if _PATH:
            probe = self.open(path, _PATH | _NOFOLLOW)
            try:
                _check_kind(os.fstat(probe).st_mode, path, allow_dir)
            finally:
                os.close(probe)
        fd = self.open(path, READ_FLAGS)
        try:
            _check_kind(os.fstat(fd).st_mode, path, allow_dir)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_dir(self, path: str, *, create: bool = False) -> int:
        """A descriptor of the directory `path`; with `create`, missing directories are made on the way
        (each made and then opened relative to its parent's descriptor)."""
        if not create:
            return self.open(path, DIR_FLAGS)
        cur = self._root_fd()
        try:
            for part in [p for p in path.split("/") if p not in ("", ".")]:
                try:
                    nxt = open_beneath(cur, part, DIR_FLAGS)
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):  # made meanwhile: open what is there
                        os.mkdir(part, 0o777, dir_fd=cur)
                    nxt = open_beneath(cur, part, DIR_FLAGS)
                os.close(cur)
                cur = nxt
        except BaseException:
            os.close(cur)
            raise
        return cur

    def replace(self, path: str, data: bytes, *, create_dirs: bool = False, must_exist: bool = False) -> bool:
        """Write `data` as the new content of the file `path`: to a fresh file in the same directory,
        renamed over the target (its permission bits kept). True if a file was replaced.

        Refused (OSError): a target that is a symbolic link (ELOOP), a directory (EISDIR), or
        another non-regular file (EINVAL); with `must_exist`, a missing one (ENOENT).
        """
        parent, _, name = path.rpartition("/")
        if name in ("", ".", ".."):
            raise OSError(errno.EISDIR, "is a directory", path)
        dir_fd = self.open_dir(parent, create=create_dirs)
        try:
            try:
                old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                if must_exist:
                    raise
                old = None
            if old is not None:
                if stat.S_ISLNK(old.st_mode):
                    raise OSError(errno.ELOOP, "is a symbolic link", path)
                if stat.S_ISDIR(old.st_mode):
                    raise OSError(errno.EISDIR, "is a directory", path)
                if not stat.S_ISREG(old.st_mode):
                    raise OSError(errno.EINVAL, "is not a regular file", path)
            tmp = f".{secrets.token_hex(6)}.tether-write"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
            # A new file gets 0o666 less the umask, as `open` would give it; a replaced one its old bits.
            fd = os.open(tmp, flags, 0o600 if old is not None else 0o666, dir_fd=dir_fd)
            try:
                try:
                    if old is not None:
                        os.fchmod(fd, stat.S_IMODE(old.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
            return old is not None
        finally:
            os.close(dir_fd)

    def walk(self, dir_fd: int, prefix: str, *, max_depth: int | None = None,
             skip_dirs: Collection[str] | Callable[[str], bool] = ()) -> Iterator[Entry]:
        """Entries under the open directory `dir_fd` (whose path is `prefix`), sorted per directory,
        each directory's entries before its subdirectories' ones. Symbolic links (and anything that
        becomes one during the walk) are left out; so are directories named in `skip_dirs`.
        (names, or a test on a name). `max_depth`: how many levels to yield (None: all). `dir_fd`
        stays the caller's."""
        skip = skip_dirs if callable(skip_dirs) else frozenset(skip_dirs).__contains__
        yield from self._walk(dir_fd, prefix, 0, max_depth, skip)

    def _walk(self, fd: int, prefix: str, depth: int, max_depth: int | None,
              skip_dir: Callable[[str], bool]) -> Iterator[Entry]:
        dirs: list[str] = []
        files: list[tuple[str, bool]] = []
        try:
            with os.scandir(fd) as it:
                for item in it:
                    if item.is_symlink():
                        continue
                    if item.is_dir(follow_symlinks=False):
                        if not skip_dir(item.name):
                            dirs.append(item.name)
                    else:
                        files.append((item.name, item.is_file(follow_symlinks=False)))
        except OSError:
            return
        dirs.sort()
        files.sort()
        base = "" if prefix in ("", ".") else prefix + "/"
        for name in dirs:
            yield Entry(base + name, True, fd, name, False)
        for name, regular in files:
            yield Entry(base + name, False, fd, name, regular)
        if max_depth is not None and depth + 1 >= max_depth:
            return
        for name in dirs:
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)  # one component, not followed if swapped
            except OSError:
                continue
            try:
                yield from self._walk(sub, base + name, depth + 1, max_depth, skip_dir)
            finally:
                os.close(sub)


def kind_of(mode: int) -> str:
    """What a file of this `st_mode` is, for a message ("a FIFO (named pipe)")."""
    kinds = [(stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
             (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _check_kind(mode: int, path: str, allow_dir: bool) -> None:
    if stat.S_ISREG(mode) or (allow_dir and stat.S_ISDIR(mode)):
        return
    if stat.S_ISDIR(mode):
        raise OSError(errno.EISDIR, "is a directory", path)
    if stat.S_ISLNK(mode):  # O_PATH|O_NOFOLLOW hands back the link itself
        raise OSError(errno.ELOOP, "is a symbolic link", path)
    raise OSError(errno.EINVAL, f"it is {kind_of(mode)}, not a regular file; the file tools read only regular files",
                  path)


def open_entry(entry: Entry) -> int:
    """A read descriptor for a walked file, opened relative to its directory, not followed (and not
    blocking: check its type with fstat before reading)."""
    return os.open(entry.name, READ_FLAGS, dir_fd=entry.dir_fd)


__all__ = ["Beneath", "Entry", "kind_of", "open_beneath", "open_entry", "openat2_available"]
