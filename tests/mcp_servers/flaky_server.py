"""A small MCP server (official SDK, stdio) that misbehaves on request, for the client's failure tests.

    python flaky_server.py [ok|crash-at-start|hang-at-start]

Tools: `echo(text)`; `hang()` never answers; `crash()` kills the process mid-call; `grow()` adds
a tool named `extra_N` and announces the change; `pid()` returns the process id; `pay_later(path,
seconds)` writes its process id to PATH.started, then appends to PATH after a while.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import anyio
import mcp_types as mt
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.subscriptions import ToolsListChanged

BUS = InMemorySubscriptionBus()
OBJECT = {"type": "object", "properties": {}}
TOOLS = [
    mt.Tool(name="echo", description="Echo the text.", input_schema={
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        annotations=mt.ToolAnnotations(read_only_hint=True, open_world_hint=False)),
    mt.Tool(name="hang", description="Never answers.", input_schema=OBJECT),
    mt.Tool(name="crash", description="Kills the server.", input_schema=OBJECT),
    mt.Tool(name="grow", description="Adds a tool.", input_schema=OBJECT),
    mt.Tool(name="pid", description="The server's process id.", input_schema=OBJECT),
    mt.Tool(name="meta", description="The request's _meta, as JSON.", input_schema=OBJECT),
    mt.Tool(name="pay_later", description="After `seconds`, append a line to `path` (a side effect in flight).",
            input_schema={"type": "object", "properties": {"path": {"type": "string"}, "seconds": {"type": "number"}},
                          "required": ["path", "seconds"]}),
]


async def list_tools(ctx: Any, params: Any) -> mt.ListToolsResult:
    return mt.ListToolsResult(tools=list(TOOLS))


async def call_tool(ctx: Any, params: mt.CallToolRequestParams) -> mt.CallToolResult:
    args = params.arguments or {}
    if params.name == "echo":
        return mt.CallToolResult(content=[mt.TextContent(text=f"echo: {args.get('text')}")])
    if params.name == "hang":
        await anyio.sleep(3600)
    if params.name == "crash":
        print("flaky: crashing on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    if params.name == "grow":
        n = len(TOOLS) - 6
        TOOLS.append(mt.Tool(name=f"extra_{n}", description=f"Extra tool {n}.", input_schema=OBJECT))
        await BUS.publish(ToolsListChanged())  # 2026-07-28 clients listen on subscriptions/listen
        await ctx.session.send_tool_list_changed()  # handshake-era clients get the notification
        return mt.CallToolResult(content=[mt.TextContent(text=f"added extra_{n}")])
    if params.name == "meta":
        return mt.CallToolResult(content=[mt.TextContent(text=json.dumps(params.meta or {}, sort_keys=True,
                                                                          default=str))])
    if params.name == "pay_later":
        started = args["path"] + ".started"  # the call is in this process now: its id, for the test to watch
        with open(started + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(started + ".tmp", started)
        time.sleep(float(args["seconds"]))  # blocking work, as many servers do: no cancellation point
        with open(args["path"], "a") as f:
            f.write("paid\n")
        return mt.CallToolResult(content=[mt.TextContent(text="paid")])
    if params.name == "pid":
        return mt.CallToolResult(content=[mt.TextContent(text=str(os.getpid()))])
    if params.name.startswith("extra_"):
        return mt.CallToolResult(content=[mt.TextContent(text=f"{params.name} ran")])
    return mt.CallToolResult(content=[mt.TextContent(text=f"no tool {params.name}")], is_error=True)


async def main(mode: str) -> None:
    if mode == "crash-at-start":
        print("flaky: cannot start, missing FLAKY_TOKEN", file=sys.stderr, flush=True)
        sys.exit(2)
    if mode == "hang-at-start":
        time.sleep(3600)
    server = Server("flaky", on_list_tools=list_tools, on_call_tool=call_tool,
                    on_subscriptions_listen=ListenHandler(BUS))
    options = server.create_initialization_options(notification_options=NotificationOptions(tools_changed=True))
    async with stdio_server() as (read, write):
        await server.run(read, write, options)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "ok"))
