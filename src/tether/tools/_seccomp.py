"""A seccomp filter that stops a sandboxed command from making setuid or setgid files.

Used where the sandbox writes a root-owned workspace through an id-mapped view (tools/_idmap.py):
there, a file the command creates belongs to root on disk, so a `chmod u+s` would leave a
setuid-root binary for later. The kernel refuses, whatever the path or the tool used, every call
that sets those bits: chmod, fchmod, fchmodat(2), and creating a file, directory or node with them
(open/openat/creat/mkdir/mknod); openat2 (its mode sits behind a pointer the filter cannot read)
and io_uring (which would bypass the filter) answer ENOSYS, so programs fall back to openat. Calls
from another ABI (i386 or x32 on x86_64) are refused outright.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH = 0, 4
_SETID = 0o6000

# arch -> (AUDIT_ARCH value, {syscall: index of its mode argument}, syscalls answered ENOSYS)
_TABLES: dict[str, tuple[int, dict[int, int], tuple[int, ...]]] = {
    "x86_64": (0xC000003E,
               {90: 1, 91: 1, 268: 2, 452: 2, 2: 2, 257: 3, 85: 1, 83: 1, 258: 2, 133: 1, 259: 2},
               (437, 425)),
    "aarch64": (0xC00000B7, {52: 1, 53: 2, 452: 2, 56: 3, 34: 2, 33: 2}, (437, 425)),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def no_setid_filter() -> bytes | None:
    """The compiled filter for this machine (None on an architecture it does not know)."""
    table = _TABLES.get(platform.machine())
    if table is None:
        return None
    audit_arch, mode_arg, unavailable = table
    prog = [_op(_LD_ABS, _ARCH), _op(_JEQ, audit_arch, 1, 0), _op(_RET, _ERRNO | errno.EPERM)]
    if audit_arch == 0xC000003E:  # x32 system calls carry bit 30
        prog += [_op(_LD_ABS, _NR), _op(_JGE, 0x40000000, 0, 1), _op(_RET, _ERRNO | errno.EPERM)]
    for nr, arg in mode_arg.items():
        prog += [_op(_LD_ABS, _NR), _op(_JEQ, nr, 0, 3),
                 _op(_LD_ABS, 16 + 8 * arg),  # the low 32 bits of the argument (little-endian)
                 _op(_JSET, _SETID, 0, 1), _op(_RET, _ERRNO | errno.EPERM)]
    for nr in unavailable:
        prog += [_op(_LD_ABS, _NR), _op(_JEQ, nr, 0, 1), _op(_RET, _ERRNO | errno.ENOSYS)]
    prog.append(_op(_RET, _ALLOW))
    return b"".join(prog)


def filter_fd() -> int | None:
    """An inheritable descriptor holding the filter, for `bwrap --seccomp FD` (the caller closes it)."""
    program = no_setid_filter()
    if program is None:
        return None
    fd = os.memfd_create("tether-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


__all__ = ["filter_fd", "no_setid_filter"]
