"""MCP servers started over stdio get an allowlisted environment (the MCP SDK's: HOME, LOGNAME, PATH,
SHELL, TERM, USER) plus the `env` their configuration names, never the rest of tether's. A real
server (the npm reference `everything` server, whose get-env tool prints its environment)."""

from __future__ import annotations

import pytest
from mcp_servers.servers import npm_server

from tether.mcp import MCPToolset, parse_config

LEAKY = {"GH_PAT": "ghp_leak1", "DB_PASS": "leak2", "MYSQL_PWD": "leak3", "REDIS_URL": "redis://:leak4@cache:6379",
         "SENTRY_DSN": "https://leak5@o1.ingest.sentry.io/1", "CI_JOB_JWT": "eyJleak6"}


async def test_an_mcp_server_sees_only_allowlisted_and_configured_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LEAKY.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PASSED_ON_PURPOSE", "wanted")
    config = {"mcpServers": {"ev": {"command": npm_server("mcp-server-everything"),
                                    "env": {"CHOSEN": "${PASSED_ON_PURPOSE}"}, "tether": {"connectTimeout": 60}}}}
    with MCPToolset(parse_config(config)) as toolset:
        assert toolset.failures == {}
        get_env = next(t for t in toolset.tools if t.name == "ev__get-env")
        out = str(await get_env.fn())
    assert "wanted" in out  # what the configuration names arrives
    for i in range(1, 7):
        assert f"leak{i}" not in out, out
