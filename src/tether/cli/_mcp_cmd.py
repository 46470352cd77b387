"""MCP on the command line: `--mcp CONFIG` for runs, `tether mcp-serve`, `tether mcp-tools`.

`tether mcp-serve --tools calculator,Read` offers tether tools to an MCP client over stdio (or
`--http HOST:PORT`, streamable HTTP at /mcp); `--agent NAME` adds an agent as one tool. Calls go
through the executor with the default SafetyPolicy acting as `--user`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tether._terminal import clean
from tether.cli import _options as o
from tether.cli._build import CliError, build_tools, workspace_of
from tether.cli._mcp_tools import open_mcp
from tether.tools._base import Tool


def select_tools(spec: str | None, workspace: Path) -> list[Tool]:
    """Tools for a comma list of tool-set names (coding, files, ...) and single tool names (Read, ...)."""
    from tether.tools import builtin

    if not spec or not spec.strip():
        return []
    by_name = {t.name.lower(): t for t in [*builtin.coding_tools(workspace), builtin.calculator]}
    picked: dict[str, Tool] = {}
    for item in (n.strip() for n in spec.split(",") if n.strip()):
        if item.lower() in o.TOOL_SETS:
            for t in build_tools(item, workspace):
                picked.setdefault(t.name, t)
        elif item.lower() in by_name:
            t = by_name[item.lower()]
            picked.setdefault(t.name, t)
        else:
            singles = sorted(t.name for t in by_name.values() if t.name.lower() not in o.TOOL_SETS)
            names = ", ".join([*o.TOOL_SETS[:-1], *singles])
            raise CliError(f"unknown tool {item!r} in --tools; choose from: {names}")
    return list(picked.values())


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"--http takes HOST:PORT (e.g. 127.0.0.1:8765), got {value!r}")
    return host.strip("[]"), int(port)


def _agent_tools(specs: list[str], opts: o.RunOptions, workspace: Path, user: str | None) -> list[Tool]:
    from tether._agent import Agent
    from tether.cli._build import DEFAULT_INSTRUCTIONS, build_limits, build_model
    from tether.mcp._server import agent_tool
    from tether.policy import SafetyPolicy

    out = []
    model = build_model(opts) if specs else None
    for spec in specs:
        name, _, tools_spec = spec.partition(":")
        if not name.strip():
            raise CliError(f"--agent takes NAME or NAME:TOOLS, got {spec!r}")
        tools = select_tools(tools_spec or opts.tools or "coding", workspace)
        assert model is not None
        agent = Agent(model, tools=tools, instructions=opts.instructions or DEFAULT_INSTRUCTIONS.format(
            workspace=workspace), limits=build_limits(opts), policy=SafetyPolicy(), user=user)
        out.append(agent_tool(agent, name.strip()))
    return out


def serve(opts: o.RunOptions, *, agents: list[str], user: str | None, http: str | None) -> int:
    """Build the executor and serve until the client goes away (stdio) or Ctrl-C (HTTP)."""
    from tether.mcp._server import build_server, serve_http, serve_stdio
    from tether.policy import SafetyPolicy
    from tether.tools._executor import Executor

    console = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        workspace = workspace_of(opts)
        tools = select_tools(opts.tools, workspace)
        tools += _agent_tools(agents, opts, workspace, user)
        if not tools:
            raise CliError("nothing to serve: give --tools (e.g. calculator,Read) and/or --agent NAME")
        address = _host_port(http) if http is not None else None
        executor = Executor(tools, policy=SafetyPolicy())
    except (CliError, ValueError) as exc:
        console.print(f"tether: {exc}", style="red", markup=False)
        return 1
    server = build_server(executor, user=user)
    try:
        if address is None:
            asyncio.run(serve_stdio(server))
        else:
            console.print(f"tether mcp-serve: http://{address[0]}:{address[1]}/mcp ({len(tools)} tools)", markup=False)
            asyncio.run(serve_http(server, *address))
    except KeyboardInterrupt:
        pass
    finally:
        executor.close()
    return 0


def list_tools(path: Path) -> int:
    """Print each server's tools, tab-separated: name, effect, output trust, the server's hints."""
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        toolset = open_mcp(path, lambda text: err.print(text, style="yellow", markup=False))
    except CliError as exc:
        err.print(f"tether: {exc}", style="red", markup=False)
        return 1
    with toolset:
        for t in toolset.tools:
            hints = t.metadata.get("mcp_annotations", {})
            shown = ", ".join(f"{k}={v}" for k, v in hints.items() if k.endswith("Hint")) or "none"
            trust = "untrusted" if t.untrusted_output else "trusted"
            typer.echo(clean(f"{t.name}\t{t.effect.value}\t{trust} output\thints: {shown}"))
    return 1 if toolset.failures else 0


Http = Annotated[str | None, typer.Option("--http", help="Serve streamable HTTP at HOST:PORT (path /mcp) "
                                          "instead of stdio.", show_default=False)]
User = Annotated[str | None, typer.Option("--user", help="The user every call acts as (policy and audit).",
                                          show_default=False)]
AgentOpt = Annotated[list[str] | None, typer.Option(
    "--agent", help="Offer an agent as one tool: NAME or NAME:TOOLS (a --tools list for it; default: --tools, "
    "else coding). Each call is one bounded run with --model and the limits. Repeatable.", show_default=False)]


def register(app: typer.Typer) -> None:
    @app.command("mcp-serve")
    def mcp_serve(
        tools: Annotated[str | None, typer.Option("--tools", "-t", help="Comma list of tool sets (coding, files, "
                                                  "bash, calculator) and tool names (Read, Write, Edit, Glob, "
                                                  "Grep, Bash, calculator).", show_default=False)] = None,
        agent: AgentOpt = None,
        http: Http = None,
        user: User = None,
        workspace: o.Workspace = None,
        model: o.Model = None,
        base_url: o.BaseUrl = None,
        api_key: o.ApiKey = None,
        max_steps: o.MaxSteps = None,
        max_seconds: o.MaxSeconds = None,
        instructions: o.Instructions = None,
    ) -> None:
        """Offer tether tools (and agents) to MCP clients, over stdio or streamable HTTP."""
        opts = o.RunOptions(tools=tools, workspace=workspace, model=model, base_url=base_url, api_key=api_key,
                            max_steps=max_steps, max_seconds=max_seconds, instructions=instructions)
        raise typer.Exit(serve(opts, agents=list(agent or []), user=user, http=http))

    @app.command("mcp-tools")
    def mcp_tools(config: Annotated[Path, typer.Argument(help="An mcpServers JSON file.", dir_okay=False)]) -> None:
        """Start the servers of CONFIG and list their tools: effect class, output trust, the server's hints."""
        raise typer.Exit(list_tools(config))
