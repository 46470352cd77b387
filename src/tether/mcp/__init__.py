"""Model Context Protocol in both directions, with the official `mcp` SDK (the `tether[mcp]` extra).

Client: `MCPToolset` turns configured servers' tools into tether tools (see `tether.mcp._client`).
Server: `build_server` / `serve_stdio` / `serve_http` offer tether tools, and agents made tools by
`agent_tool`, to MCP clients (see `tether.mcp._server`). Both call tools through the executor.
"""

from tether.mcp._client import MCPToolError, MCPToolset, MCPUnavailable, mcp_tool
from tether.mcp._config import MCPConfigError, ServerConfig, TetherSettings, load_config, parse_config
from tether.mcp._server import agent_tool, build_server, serve_http, serve_stdio

__all__ = ["MCPConfigError", "MCPToolError", "MCPToolset", "MCPUnavailable", "ServerConfig", "TetherSettings",
           "agent_tool", "build_server", "load_config", "mcp_tool", "parse_config", "serve_http", "serve_stdio"]
