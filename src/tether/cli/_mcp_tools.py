"""The MCP servers a CLI run uses (`--mcp FILE`): started, their tools merged in, closed with the run."""

from __future__ import annotations

import atexit
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.cli._errors import CliError
from tether.tools._base import Tool

if TYPE_CHECKING:  # the mcp extra is imported only when a command needs it
    from tether.mcp import MCPToolset

_OPEN: dict[int, MCPToolset] = {}  # executor id -> the toolset feeding it, closed with the CLI run


def open_mcp(path: Path, announce: Callable[[str], None] | None = None) -> MCPToolset:
    """Start the servers of an mcpServers file; a server that fails is announced and left out."""
    try:
        from tether.mcp import MCPConfigError, MCPToolset, load_config
    except ImportError as exc:
        raise CliError(f"--mcp needs the mcp extra: pip install 'tether[mcp]' ({exc})") from exc
    try:
        servers = load_config(path)
    except MCPConfigError as exc:
        raise CliError(str(exc)) from exc
    # each tool left out is one line on stderr, once (also when a tool-list change lists it again)
    toolset = MCPToolset(servers, warn=None if announce is None else lambda text: announce(f"mcp: {text}")).start()
    atexit.register(toolset.close)  # a safety net; close_mcp closes it first
    if announce is not None:
        for name, why in toolset.failures.items():
            announce(f"mcp: {why}; the tools of '{name}' are not available")
    return toolset


def usable(toolset: MCPToolset, tools: list[Tool], announce: Callable[[str], None] | None = None) -> list[Tool]:
    """The toolset's tools whose names no other tool of the run has (those are announced and left out)."""
    taken = {t.name for t in tools}
    for t in toolset.tools:
        if t.name in taken and announce is not None:
            announce(f"mcp: tool '{t.name}' of server '{t.metadata['mcp_server']}' is left out: a built-in tool "
                     "has that name (set a 'prefix' for the server)")
    return [t for t in toolset.tools if t.name not in taken]


def adopt(toolset: MCPToolset, executor: Any) -> None:
    """Tie the toolset to the executor: it follows tool-list changes and closes with `close_mcp`."""
    toolset.attach(executor)
    _OPEN[id(executor)] = toolset


def close_mcp(executor: Any) -> None:
    """Close the MCP sessions opened for `executor` (stops servers started over stdio)."""
    toolset = _OPEN.pop(id(executor), None)
    if toolset is not None:
        toolset.close()
