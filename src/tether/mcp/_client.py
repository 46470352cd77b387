"""MCP client: the tools of configured MCP servers become tether `Tool`s, run by the executor.

```python
from tether.mcp import MCPToolset, load_config

with MCPToolset(load_config("mcp.json")) as mcp:          # or: async with MCPToolset(...) as mcp
    agent = Agent(model, tools=[*builtin.file_tools("."), *mcp.tools])
    mcp.attach(agent.executor)                              # follow notifications/tools/list_changed
    agent.run("...")
```

Each tool goes through the executor like any other, so validation, policy, approvals, capping and
audit apply. Until the user confirms otherwise in the config (see `TetherSettings`), an MCP tool is
irreversible and its output untrusted. A server that fails to start is left out and reported in
`failures`; one that hangs or crashes during a call gives that call a tool error (each call has a
timeout), and the next call starts it again.

The sessions live on one background event loop owned by the toolset, so they outlast the event
loop of any single run (`Agent.run` starts a new one each time) and are opened and closed in one
task each, as the SDK's anyio scopes require.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

import httpx2
import mcp_types as mt
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tether._errors import TetherError
from tether._loop import ParentRun
from tether._types import Usage
from tether.events import OBSERVERS
from tether.mcp._config import MCPConfigError, ServerConfig
from tether.mcp._convert import annotations_of, effect_of, result_text
from tether.tools._base import Tool, ToolContext
from tether.tools._declares import Declares

log = logging.getLogger(__name__)
T = TypeVar("T")
_MAX_PAGES = 100  # a paginator that never ends cannot hang a listing
_STDERR_TAIL = 600



# Run in the server's process before it becomes the server: the kernel kills it when tether dies,
# even by SIGKILL (the SDK starts it in a session of its own, where it would run on, finishing a
# call whose result nobody records; the recovered run then repeats it).
_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # tether died before the line above
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    print(f"cannot start {sys.argv[2]}: {exc.strerror}", file=sys.stderr, flush=True)
    os._exit(127)
"""


def _dying_with_us(command: str, args: list[str]) -> tuple[str, list[str]]:
    """The command and arguments that start a stdio server bound to this process's life (Linux)."""
    if not sys.platform.startswith("linux"):
        return command, args
    # -I: neither the working directory nor PYTHON* variables reach this helper's imports (a ctypes.py or
    # signal.py in the directory would otherwise run here, outside any sandbox)
    return sys.executable, ["-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), command, *args]

class MCPToolError(TetherError):
    """An MCP tool call that did not produce a result; the text is what the model reads."""


class MCPUnavailable(MCPToolError):
    """The server could not be reached, started, or kept running."""


class _Portal:
    """A private event loop on a daemon thread; coroutines are handed to it from any thread or loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tether-mcp", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` there and wait for it (from a thread that is not the portal's)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` run there; cancelling the caller cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class _StderrLog:
    """A server's stderr, kept in an unlinked file so failures can quote its last lines."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="tether-mcp-", suffix=".log")
        os.close(fd)
        self.file = open(path, "a+", encoding="utf-8", errors="replace")  # noqa: SIM115 - lives with the connection
        os.unlink(path)

    def tail(self) -> str:
        fd = self.file.fileno()
        size = os.fstat(fd).st_size
        text = os.pread(fd, _STDERR_TAIL, max(0, size - _STDERR_TAIL)).decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()][-3:]
        return " | ".join(lines)

    def close(self) -> None:
        self.file.close()


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking through anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Connection:
    """One MCP server: its session is entered and left by one owner task on the portal loop."""

    def __init__(self, config: ServerConfig, on_tools_changed: Callable[[], None]) -> None:
        self.config = config
        self.tools: list[mt.Tool] = []
        self.client: Client | None = None
        self._on_tools_changed = on_tools_changed
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock: asyncio.Lock | None = None
        self._stderr: _StderrLog | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._dying: set[asyncio.Task[None]] = set()
        self._stale = False

    @property
    def name(self) -> str:
        return self.config.name

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        cfg = self.config
        if cfg.url is not None:
            # a client passed in is not closed by the transport: the stack closes it
            http = await stack.enter_async_context(httpx2.AsyncClient(
                headers=cfg.headers, timeout=httpx2.Timeout(cfg.tether.connect_timeout, read=300)))
            return streamable_http_client(cfg.url, http_client=http)
        if self._stderr is None:
            self._stderr = _StderrLog()
        assert cfg.command is not None
        command, args = _dying_with_us(cfg.command, list(cfg.args))
        params = StdioServerParameters(command=command, args=args, env=cfg.env, cwd=cfg.cwd)
        return stdio_client(params, errlog=self._stderr.file)

    def _why(self) -> str:
        tail = self._stderr.tail() if self._stderr is not None else ""
        return f" (its stderr: {tail})" if tail else ""

    async def open(self) -> None:
        """Connect and list the tools, within the connect timeout; raises MCPUnavailable."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.client is None:
                await self._open()

    async def _open(self) -> None:
        await self._stop()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._task = asyncio.create_task(self._own(ready), name=f"mcp:{self.name}")
        seconds = self.config.tether.connect_timeout
        try:
            async with asyncio.timeout(seconds):
                await asyncio.shield(ready)
        except TimeoutError:
            await self._stop(wait=False)  # the SDK's process shutdown takes seconds: not on this clock
            raise MCPUnavailable(f"MCP server '{self.name}' did not start within {seconds:g} s{self._why()}") from None
        except Exception as exc:
            await self._stop()
            raise MCPUnavailable(f"MCP server '{self.name}' failed to start - {_describe(exc)}{self._why()}") from None

    async def _own(self, ready: asyncio.Future[None]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack, Client(
                    await self._transport(stack), message_handler=self._on_message, cache=None,
                    client_info=mt.Implementation(name="tether", version=_version())) as client:
                self.tools = await self._list(client)
                while self._stale:  # the list changed while it was being fetched
                    self._stale = False
                    self.tools = await self._list(client)
                self.client = client
                if not ready.done():
                    ready.set_result(None)
                await self._follow(client)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # anyio reports transport failures as exception groups
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(_describe(exc)))
            else:
                log.info("MCP server %s closed: %s", self.name, _describe(exc))
        finally:
            if self._task is asyncio.current_task():  # an abandoned owner must not unset its successor's
                self.client = None

    async def _follow(self, client: Client) -> None:
        """Until closed, re-list the tools when the server says they changed. Handshake-era servers
        send notifications/tools/list_changed (see `_on_message`); 2026-07-28 servers send them on a
        subscriptions/listen stream, which must be opened and left in this task."""
        caps = client.server_capabilities.tools
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or caps is None or not caps.list_changed:
            await self._closing.wait()
            return
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                consumer = asyncio.get_running_loop().create_task(self._consume(subscription))
                try:
                    await self._closing.wait()
                finally:
                    consumer.cancel()
                    with contextlib.suppress(BaseException):
                        await consumer
        except Exception as exc:  # listening is a nicety: the tools keep working without it
            log.info("MCP server %s: not following tool-list changes: %s", self.name, _describe(exc))
            await self._closing.wait()

    async def _consume(self, subscription: Any) -> None:
        async for _event in subscription:
            await self._relist()

    async def _list(self, client: Client) -> list[mt.Tool]:
        tools: list[mt.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        allowed = self.config.tether.tools
        return [t for t in tools if allowed is None or t.name in allowed]

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mt.ToolListChangedNotification):
            if self.client is None:  # still starting: the owner task lists again before it is ready
                self._stale = True
                return
            # re-list outside the session's receive loop, which must stay free to deliver the answer
            self._refresh = asyncio.get_running_loop().create_task(self._relist())

    async def _relist(self) -> None:
        client = self.client
        if client is None:
            return
        try:
            async with asyncio.timeout(self.config.tether.call_timeout):
                self.tools = await self._list(client)
        except Exception as exc:
            log.warning("MCP server %s: re-listing its tools failed: %s", self.name, _describe(exc))
            return
        self._on_tools_changed()

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> mt.CallToolResult:
        """One tools/call within the call timeout; a dead session is started again first."""
        if self.client is None:
            before = {t.name: t for t in self.tools}
            await self.open()
            if {t.name: t for t in self.tools} != before:
                self._on_tools_changed()
        client = self.client
        if client is None:
            raise MCPUnavailable(f"MCP server '{self.name}' is not running{self._why()}")
        seconds = self.config.tether.call_timeout
        try:
            async with asyncio.timeout(seconds):
                return await client.call_tool(name, arguments, meta=meta)  # type: ignore[arg-type]
        except TimeoutError:
            raise MCPUnavailable(f"MCP server '{self.name}' did not answer '{name}' within {seconds:g} s. Try "
                                 "a smaller request or another approach.") from None
        except MCPError as exc:
            if exc.code != mt.CONNECTION_CLOSED:  # the server answered with an error: the session is fine
                raise MCPToolError(f"MCP server '{self.name}' refused '{name}': {exc.error.message}") from None
            broken: Exception = exc
        except Exception as exc:  # the transport broke
            broken = exc
        await self._stop()
        raise MCPUnavailable(f"MCP server '{self.name}' crashed or went away during '{name}' - {_describe(broken)}"
                             f"{self._why()}. It will be started again on the next call.")

    async def _stop(self, *, wait: bool = True) -> None:
        """End the owner task: politely when the session is up (the SDK closes stdin, then
        terminates the process), by cancellation when it never came up or does not finish.
        `wait=False` leaves the cancelled task to finish by itself; `close` waits for it."""
        task, self._task = self._task, None
        was_up, self.client = self.client is not None, None
        if task is None:
            return
        self._closing.set()
        if was_up:
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(5):
                    await asyncio.shield(task)
        if not task.done():
            task.cancel()
            if not wait:
                self._dying.add(task)
                task.add_done_callback(self._dying.discard)
                return
            with contextlib.suppress(BaseException):
                await task

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        await self._stop()
        if self._dying:
            await asyncio.wait(list(self._dying), timeout=10)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _version() -> str:
    from tether import __version__

    return __version__


class MCPToolset:
    """The tools of several MCP servers, as tether tools. Use as a context manager (sync or async);
    `start()` / `close()` do the same by hand. A tool left out (`warnings`) is told once to `warn`
    (default: a warning in the `tether.mcp` log)."""

    def __init__(self, servers: Iterable[ServerConfig], *, warn: Callable[[str], None] | None = None) -> None:
        self.servers = list(servers)
        self.failures: dict[str, str] = {}  # server name -> why it is not available
        self.warnings: list[str] = []  # tools left out (name clashes, declarations naming no argument)
        # each new warning, once, as one line: the CLI prints it on stderr; by default the log (a service's)
        self._warn = warn if warn is not None else (lambda text: log.warning("MCP: %s", text))
        self._portal: _Portal | None = None
        self._connections: dict[str, _Connection] = {}
        self._tools: dict[str, Tool] = {}
        self._listeners: list[Callable[[list[Tool], list[str]], None]] = []

    @property
    def tools(self) -> list[Tool]:
        """The tether tools of every connected server, now."""
        return list(self._tools.values())

    def start(self) -> MCPToolset:
        """Connect every server at once, each within its connect timeout. Never raises for a server:
        one that fails is left out and described in `failures`."""
        if self._portal is None:
            self._portal = _Portal()
            self._portal.run(self._start())
        return self

    async def _start(self) -> None:
        self._connections = {s.name: _Connection(s, self._changed_soon(s.name)) for s in self.servers}
        outcomes = await asyncio.gather(*(c.open() for c in self._connections.values()), return_exceptions=True)
        for conn, outcome in zip(self._connections.values(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self.failures[conn.name] = str(outcome) if isinstance(outcome, MCPToolError) else _describe(outcome)
            else:
                for t in self._wrap(conn):
                    if t.name in self._tools:  # two servers with the same prefix: the first one keeps it
                        self._warning(f"tool '{t.name}' of server '{conn.name}' is left out: the name is "
                                      f"taken by server '{self._tools[t.name].metadata['mcp_server']}'")
                    else:
                        self._tools[t.name] = t

    def _wrap(self, conn: _Connection) -> list[Tool]:
        tools: list[Tool] = []
        for t in conn.tools:
            try:
                tools.append(mcp_tool(conn.config, t, self._caller(conn, t.name)))
            except MCPConfigError as exc:  # a declaration that cannot hold: the tool is left out (fail closed)
                self._warning(str(exc))
        return tools

    def _warning(self, text: str) -> None:
        """Note a tool left out, and tell it once (a tool-list change lists the same tools again)."""
        if text in self.warnings:
            return
        self.warnings.append(text)
        with contextlib.suppress(Exception):  # a failing printer must not stop the servers starting
            self._warn(" ".join(text.split()))

    def _caller(self, conn: _Connection, name: str) -> Callable[..., Awaitable[str]]:
        portal = self._portal
        assert portal is not None

        async def call(_tether_context: ToolContext | None = None, **arguments: Any) -> str:
            # The call's idempotency key goes to the server in the request's _meta, so a server can
            # recognise a retried or recovered call (see docs/mcp.md)
            meta: dict[str, Any] | None = None if _tether_context is None else {
                IDEMPOTENCY_META: _tether_context.idempotency_key, RUN_META: _tether_context.run_id}
            parent = _tether_context.run.parent if _tether_context is not None else None
            budget = parent.budget if isinstance(parent, ParentRun) else None
            # a share of what the run has left is offered (reserved meanwhile); a tether server runs its
            # agent within it and says what it used, which is charged here (others say nothing: 0)
            carved = budget.carve(0.5) if budget is not None else (None, None)
            if meta is not None and budget is not None:
                meta[BUDGET_META] = {"max_tokens": carved[0], "max_cost_usd": carved[1]}
            if meta is not None and _tether_context is not None and OBSERVERS:  # the server's spans join this trace
                from tether.telemetry._otel import trace_carrier

                meta.update(trace_carrier(_tether_context.run_id, _tether_context.call_id))
            used = Usage()
            try:
                result = await portal.arun(conn.call(name, arguments, meta))
                used = usage_from_meta(result.meta)
            finally:
                if budget is not None:
                    budget.settle(carved[0], carved[1], used)
            text = result_text(result)
            if result.is_error:
                raise MCPToolError(text or f"'{name}' failed without saying why")
            return text

        return call

    def _changed_soon(self, server: str) -> Callable[[], None]:
        def changed() -> None:
            conn = self._connections[server]
            old = [n for n, t in self._tools.items() if t.metadata.get("mcp_server") == server]
            new = [t for t in self._wrap(conn) if self._tools.get(t.name, t).metadata.get("mcp_server") == server]
            tools = {n: t for n, t in self._tools.items() if n not in old}
            tools.update((t.name, t) for t in new)
            self._tools = tools
            for listener in self._listeners:
                listener(new, old)

        return changed

    def attach(self, executor: Any) -> None:
        """Keep `executor`'s tools in step with the servers' tool lists (tools/list_changed, restarts).
        A server's new tool never replaces one the executor got elsewhere (a built-in of that name)."""

        def update(add: list[Tool], remove: list[str]) -> None:
            def ours(name: str) -> bool:
                held = executor.tools.get(name)
                return held is None or "mcp_server" in held.metadata

            executor.update_tools(add=[t for t in add if ours(t.name)], remove=[n for n in remove if ours(n)])

        self._listeners.append(update)

    def close(self) -> None:
        """Close every session (servers started over stdio are stopped) and the background loop."""
        portal, self._portal = self._portal, None
        if portal is None:
            return
        with contextlib.suppress(Exception):
            portal.run(self._close())
        portal.stop()

    async def _close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._connections.values()), return_exceptions=True)

    def __enter__(self) -> MCPToolset:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MCPToolset:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)


IDEMPOTENCY_META = "tether/idempotency_key"  # in a tools/call request's _meta: run:step:index, stable on recovery
RUN_META = "tether/run_id"
BUDGET_META = "tether/budget"  # in the request: {max_tokens, max_cost_usd} the call may spend (null: no limit)
USAGE_META = "tether/usage"  # in the result: what the call spent on models (Usage's fields)


_USAGE_FIELDS = ("input_tokens", "output_tokens", "cost_usd", "model_calls")


def usage_to_meta(used: Usage) -> dict[str, Any]:
    """A result's _meta reporting `used` (what `usage_from_meta` reads)."""
    return {USAGE_META: {f: getattr(used, f) for f in _USAGE_FIELDS}}


def usage_from_meta(meta: Any) -> Usage:
    """The usage a result's _meta reports under USAGE_META (zero when absent or malformed: a server
    cannot make a call cost less than nothing, nor break the call by reporting badly)."""
    got = meta.get(USAGE_META) if isinstance(meta, dict) else None
    if not isinstance(got, dict):
        return Usage()
    values = {f: got.get(f, 0) for f in _USAGE_FIELDS}
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values.values()):
        return Usage()
    return Usage(input_tokens=int(values["input_tokens"]), output_tokens=int(values["output_tokens"]),
                 cost_usd=float(values["cost_usd"]), model_calls=int(values["model_calls"]))


def mcp_tool(server: ServerConfig, spec: mt.Tool, call: Callable[..., Awaitable[str]]) -> Tool:
    """A tether Tool for one MCP tool: irreversible and untrusted unless the user's config says
    otherwise; the server's hints are kept in metadata either way."""
    declared = dict(server.tether.declare.get(spec.name, {}))
    hide_output: bool | None = declared.pop("hide_output", None)
    untrusted: bool | None = declared.pop("untrusted", None)
    trusted = server.tether.output_trusted(spec.name) if untrusted is None else not untrusted
    _check_arguments(server, spec, declared)
    metadata: dict[str, Any] = {"mcp_server": server.name, "mcp_tool": spec.name,
                                "mcp_annotations": annotations_of(spec)}
    description = spec.description or spec.title or spec.name
    declared.setdefault("source", None if trusted else "mcp")
    return Tool.from_schema(
        server.tool_name(spec.name), description, dict(spec.input_schema), call,
        effect=effect_of(server, spec), untrusted_output=not trusted,
        # the connection's own call timeout answers first, with a better message
        timeout=server.tether.call_timeout + server.tether.connect_timeout + 5, metadata=metadata,
        declares=Declares(**declared), hide_output=hide_output,
        context_param="_tether_context",
    )


_ARG_FIELDS = ("code_args", "url_args", "risk_free_args", "guarded_args", "sends_to", "writes_path")


def _check_arguments(server: ServerConfig, spec: mt.Tool, declared: dict[str, Any]) -> None:
    """Every argument a declaration names is one of the tool's parameters: a misspelt `codeArgs` would
    otherwise protect nothing, so the tool is left out with this reason (MCPConfigError)."""
    params = set(dict(spec.input_schema).get("properties") or {})
    for name in _ARG_FIELDS:
        value = declared.get(name)
        named = (value,) if isinstance(value, str) and name == "writes_path" else value if isinstance(value, tuple) else ()
        missing = sorted(set(named) - params)
        if missing:
            raise MCPConfigError(f"tool '{spec.name}' of server '{server.name}' is left out: its declared {name} "
                                 f"names {', '.join(map(repr, missing))}, not among its arguments "
                                 f"({', '.join(sorted(params)) or 'none'})")
