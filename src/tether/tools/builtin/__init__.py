"""Built-in tools: calculator, workspace file tools (Read, Write, Edit, Glob, Grep) and Bash."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tether.tools._base import Tool
from tether.tools.builtin._calculator import calculator
from tether.tools.builtin._files import (
    Workspace,
    edit_tool,
    file_tools,
    glob_tool,
    grep_tool,
    read_tool,
    write_tool,
)
from tether.tools.builtin._shell import shell_tool

if TYPE_CHECKING:
    from tether.staging import StagedWorkspace


def coding_tools(root: str | Path, *, bash_timeout: float = 120, allow_net: bool = False,
                 pass_env: Sequence[str] = (), protect: Sequence[str] = (), readable: Sequence[str] = (),
                 warn: Callable[[str], None] | None = None, stage: StagedWorkspace | None = None) -> list[Tool]:
    """Read, Write, Edit, Glob, Grep and Bash (sandboxed), all working in `root` (the CLI's default set).
    `pass_env`: environment variable names Bash commands get besides the allowlist; `protect`: workspace
    paths kept read-only for them besides .git; `readable`: host paths they may read besides the toolchain;
    `stage`: work in the run's staged view of `root` (tether.staging: writes are reviewed and applied at
    the end, and need no approval meanwhile)."""
    return [*file_tools(root, protect=protect, stage=stage),
            shell_tool(root, timeout=bash_timeout, allow_net=allow_net, pass_env=pass_env, executed_later=protect,
                       readable=readable, warn=warn, stage=stage)]


__all__ = [
    "Workspace",
    "calculator",
    "coding_tools",
    "edit_tool",
    "file_tools",
    "glob_tool",
    "grep_tool",
    "read_tool",
    "shell_tool",
    "write_tool",
]
