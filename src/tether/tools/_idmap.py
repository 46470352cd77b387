"""An id-mapped view of a root-owned workspace, so a sandbox running as `nobody` can write it.

When tether runs as root on a workspace that root owns, the sandboxed command must not run as root
(it could read /etc/shadow and leave setuid-root binaries), yet it should be able to write the
workspace. An id-mapped mount (Linux 5.12+, `mount_setattr(MOUNT_ATTR_IDMAP)`) does exactly that:
through it, files owned by root appear owned by the unprivileged user, and files that user creates
are stored as root's. The view is attached on a private directory for the time of one command and
bound into the sandbox in place of the workspace; nothing in the workspace changes owner.

`idmapped_view` returns None where the kernel or the filesystem cannot do this; the caller then
runs the command as `nobody` on the plain workspace (read-only to it) and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every architecture
_OPEN_TREE_CLONE = 1
_AT_RECURSIVE = 0x8000
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000
_MNT_DETACH = 2


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_userns: dict[tuple[int, int], int] = {}  # (uid, gid) -> an open user namespace mapping root to them
_broken: list[str] = []  # why id-mapped views do not work here (once known)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _user_namespace(uid: int, gid: int) -> int:
    """A user namespace in which root (0) is `uid`/`gid` outside (made once, kept open)."""
    if (uid, gid) in _userns:
        return _userns[(uid, gid)]
    ours = os.readlink("/proc/self/ns/user")
    child = subprocess.Popen(["unshare", "--user", "--", "sleep", "60"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):  # until the child has its own user namespace
            try:
                if os.readlink(f"/proc/{child.pid}/ns/user") != ours:
                    break
            except OSError:
                pass
            if child.poll() is not None:
                raise OSError(f"unshare --user exited with {child.returncode}")
            time.sleep(0.002)
        Path(f"/proc/{child.pid}/uid_map").write_text(f"0 {uid} 1\n")
        Path(f"/proc/{child.pid}/gid_map").write_text(f"0 {gid} 1\n")
        fd = os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        child.kill()
        child.wait()
    _userns[(uid, gid)] = fd
    return fd


def idmapped_view(path: Path, uid: int, gid: int) -> tuple[Path, Callable[[], None]] | None:
    """A directory showing `path` with root's files as `uid`/`gid`'s, and the function that removes
    it; None where id-mapped mounts are not available (the reason is kept in `why_not()`)."""
    if _broken or os.geteuid() != 0:
        return None
    mountpoint: Path | None = None
    tree = -1
    try:
        userns = _user_namespace(uid, gid)
        tree = _check(_libc.syscall(_SYS_OPEN_TREE, -100, os.fsencode(path),
                                    _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE), "open_tree")
        attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, userns)
        _check(_libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attr),
                             ctypes.sizeof(attr)), "mount_setattr")
        mountpoint = Path(tempfile.mkdtemp(prefix="tether-ws-"))
        _check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", -100, os.fsencode(mountpoint),
                             _MOVE_MOUNT_F_EMPTY_PATH), "move_mount")
    except OSError as exc:
        _broken.append(str(exc))
        if mountpoint is not None:
            with contextlib.suppress(OSError):
                mountpoint.rmdir()
        return None
    finally:
        if tree >= 0:
            os.close(tree)
    where = mountpoint

    def remove() -> None:
        _libc.umount2(os.fsencode(where), _MNT_DETACH)
        with contextlib.suppress(OSError):
            where.rmdir()

    return where, remove


def why_not() -> str | None:
    """Why id-mapped views failed here, if they did."""
    return _broken[0] if _broken else None


__all__ = ["idmapped_view", "why_not"]
