"""Run a command on a pseudo-terminal, as a person would, and answer its questions."""

from __future__ import annotations

import os
import pty
import select
import time
from pathlib import Path

from hang import HANG


def on_a_terminal(argv: list[str], cwd: Path, env: dict[str, str], answers: dict[bytes, bytes],
                   timeout: float = HANG) -> bytes:
    """Run `argv` on a pseudo-terminal; each time a key of `answers` appears (again), type its value."""
    pid, fd = pty.fork()
    if pid == 0:  # the child
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    out = b""
    seen = dict.fromkeys(answers, 0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            for question, answer in answers.items():
                if out.count(question) > seen[question]:
                    seen[question] = out.count(question)
                    os.write(fd, answer)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return out
