"""MCP server: tether tools, and agents as single tools, offered to any MCP client.

Every tools/call goes through an `Executor` with the policy it was built with (the CLI uses the
default `SafetyPolicy`) and the configured user, exactly as the model's calls do. A refusal,
an invalid argument or a failing tool comes back as a tool result with `isError: true` and the
executor's text, so the calling agent can act on it. Each MCP session is one tether run for the
policy: what a session read taints that session's later calls (see `run_id` below).

```python
server = build_server(Executor([calculator, read_tool(".")], policy=SafetyPolicy()), user="alice")
await serve_stdio(server)            # or: await serve_http(server, "127.0.0.1", 8765)
```
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict
from typing import Any

import mcp_types as mt
from mcp.server.lowlevel import Server

from tether._agent import Agent
from tether._errors import NotFound
from tether._types import Effect, ToolCall, Usage
from tether.events import OBSERVERS
from tether.mcp._client import BUDGET_META, usage_to_meta
from tether.tools._base import Tool
from tether.tools._executor import CallContext, Executor
from tether.tools._extra import RunFacts


def agent_tool(agent: Agent, name: str, description: str = "") -> Tool:
    """An agent as one tool: `agent.as_tool(name, description)` (each call one whole run of `agent` on
    the task it is given; inside a tether run its budget is carved from the caller's and charged back)."""
    return agent.as_tool(name, description)


def _annotations(tool: Tool) -> mt.ToolAnnotations:
    return mt.ToolAnnotations(read_only_hint=tool.effect is Effect.READ_ONLY,
                              destructive_hint=tool.effect is Effect.IRREVERSIBLE,
                              open_world_hint=bool(tool.untrusted_output))


def _budget_offer(meta: Any) -> tuple[int | None, float | None] | None:
    """The (max tokens, max cost) a tether client offered in the request's _meta; None when it
    offered none. A malformed offer is taken as the smallest one (nothing to spend), not as none."""
    got = meta.get(BUDGET_META) if isinstance(meta, dict) else None
    if got is None:
        return None
    tokens = got.get("max_tokens") if isinstance(got, dict) else 0
    cost = got.get("max_cost_usd") if isinstance(got, dict) else 0.0
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
        tokens = 0
    if cost is not None and (not isinstance(cost, int | float) or isinstance(cost, bool) or not cost >= 0):
        cost = 0.0
    return tokens, None if cost is None else float(cost)


MAX_SESSIONS = 10_000  # sessions whose policy state a server keeps (least recently used go first)


class SessionStates:
    """The policy state of each MCP session (the session is the run): at most `limit`, least
    recently used evicted first. A call in an evicted session is refused rather than started clean,
    so what it read keeps counting (fail closed)."""

    def __init__(self, executor: Executor, user: str | None, limit: int = MAX_SESSIONS) -> None:
        self.executor, self.user, self.limit = executor, user, limit
        self._states: OrderedDict[str, Any] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()

    def get(self, run_id: str) -> Any:
        if run_id in self._evicted:
            raise NotFound("this MCP session was idle too long and its safety state was dropped; "
                              "open a new session")
        if run_id in self._states:
            self._states.move_to_end(run_id)
            return self._states[run_id]
        state = self._states[run_id] = self.executor.policy.start_run(run_id, self.user, [], [])
        while len(self._states) > self.limit:
            self._evicted[self._states.popitem(last=False)[0]] = None
            while len(self._evicted) > 10 * self.limit:
                self._evicted.popitem(last=False)
        return state


def build_server(executor: Executor, *, user: str | None = None, name: str = "tether") -> Server[Any]:
    """An MCP server offering `executor`'s tools (read_result too, for capped outputs)."""
    base = f"mcp-{uuid.uuid4().hex[:12]}"
    counter = itertools.count(1)
    sessions = SessionStates(executor, user)

    def run_id(ctx: Any) -> str:
        # The policy's run is the client's session: over stdio the process serves one client; over
        # HTTP the Mcp-Session-Id names it. Sessionless (2026-07-28 stateless) HTTP clients share one
        # run, so what one of them read taints all: the safe direction.
        headers = getattr(getattr(ctx, "request", None), "headers", None)
        sid = headers.get("mcp-session-id") if headers is not None else None
        return f"{base}-{sid}" if sid else base

    async def list_tools(ctx: Any, params: mt.PaginatedRequestParams | None) -> mt.ListToolsResult:
        return mt.ListToolsResult(tools=[
            mt.Tool(name=t.name, description=t.description, input_schema=t.parameters, annotations=_annotations(t))
            for t in executor.tools.values()])

    async def call_tool(ctx: Any, params: mt.CallToolRequestParams) -> mt.CallToolResult:
        call = ToolCall(f"mcp{next(counter)}", params.name, dict(params.arguments or {}))
        used = Usage()
        # for an agent tool's run: the budget the calling agent offered, and where its spending is added
        facts = RunFacts(budget_offer=_budget_offer(params.meta), usage_sink=used)
        token = None
        if OBSERVERS:  # telemetry on: a caller's trace context in _meta parents this call's spans
            from tether.telemetry._otel import attached_from

            token = attached_from(params.meta)
        try:
            session = run_id(ctx)
            try:
                state = sessions.get(session)
            except LookupError as exc:
                return mt.CallToolResult(content=[mt.TextContent(text=f"ERROR: '{call.name}' was not run: {exc}")],
                                         is_error=True)
            result = await executor.execute(call, CallContext(run_id=session, user=user, run=facts,
                                                              policy_state=state))
        finally:
            if token is not None:
                from tether.telemetry._otel import detach

                detach(token)
        # what an agent tool's run spent, for a tether client to charge to its own run's budget
        meta = usage_to_meta(used) if used.model_calls else None
        return mt.CallToolResult(content=[mt.TextContent(text=result.content)], is_error=result.is_error,
                                 _meta=meta)  # (the field `meta`, by its alias)

    from tether import __version__

    return Server(name, version=__version__, on_list_tools=list_tools, on_call_tool=call_tool,
                  get_tool_input_schema=lambda n: executor.tools[n].parameters if n in executor.tools else None)


async def serve_stdio(server: Server[Any]) -> None:
    """Serve one client over this process's stdin and stdout until it closes them."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(server: Server[Any], host: str, port: int) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp until cancelled (Ctrl-C)."""
    import uvicorn

    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve()
