"""Where the tests find their MCP servers: the npm reference servers (installed by scripts/bootstrap
from package.json) and `flaky_server.py`. Under CI=true a missing server fails the test."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FLAKY = HERE / "flaky_server.py"
REPO = HERE.parents[1]
PROVIDER_VARS = ("OPENAI_", "OPENROUTER_", "TETHER_", "ANTHROPIC_")


def env(**extra: str) -> dict[str, str]:
    """The environment for a `python -m tether` child: this checkout's code, no provider settings."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(PROVIDER_VARS)}
    out["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), out.get("PYTHONPATH", "")])
    out.update(extra)
    return out


def npm_server(name: str) -> str:
    """The executable of an npm MCP server, e.g. `mcp-server-everything`."""
    path = HERE / "node_modules" / ".bin" / name
    if not path.exists() or shutil.which("node") is None:  # installed once, node may be gone since
        message = (f"{name} is not installed: run scripts/bootstrap (npm ci --prefix tests/mcp_servers)"
                   if not path.exists() else f"{name} needs node, which is not on PATH")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return str(path)


def flaky(mode: str = "ok", **tether: object) -> dict[str, object]:
    """An mcpServers entry for the flaky test server."""
    entry: dict[str, object] = {"command": sys.executable, "args": [str(FLAKY), mode]}
    if tether:
        entry["tether"] = tether
    return entry
