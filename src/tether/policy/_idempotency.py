"""Idempotency: a retried call with the same key (run id + call id) does not act twice.

`idempotent(tool, cache)` returns a tool that looks the key up before running and stores the
result after; concurrent calls with one key share a single execution. The cache is a protocol so
the run store can back it later (`get`/`put` of text).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from typing import Any, Protocol

from tether.tools._base import Tool, ToolContext
from tether.tools._declares import LEGACY_KEYS
from tether.tools._results import ToolOutput, shape


class IdempotencyCache(Protocol):
    def get(self, key: str) -> str | None: ...

    def put(self, key: str, value: str) -> None: ...


class MemoryIdempotency:
    """In-memory cache, bounded (oldest keys forgotten first)."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._items: OrderedDict[str, str] = OrderedDict()
        self.hits = 0

    def get(self, key: str) -> str | None:
        value = self._items.get(key)
        if value is not None:
            self.hits += 1
        return value

    def put(self, key: str, value: str) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_keys:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


_CTX = "_tether_context"


def idempotent(tool: Tool, cache: IdempotencyCache) -> Tool:
    """A copy of `tool` that acts at most once per idempotency key. Errors are not cached (a
    failed call may be retried)."""
    inner_param = tool.context_param
    param = inner_param or _CTX
    inflight: dict[str, asyncio.Future[str]] = {}

    async def run(**kwargs: Any) -> str | ToolOutput:
        ctx: ToolContext = kwargs[param]
        if inner_param is None:
            kwargs.pop(param)
        key = ctx.idempotency_key or f"{ctx.run_id}:{ctx.call_id}"
        cached = cache.get(key)
        if cached is not None:
            return cached
        running = inflight.get(key)
        if running is not None:
            return await asyncio.shield(running)
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        inflight[key] = fut
        try:
            if tool.is_async:
                value = await tool.fn(**kwargs)
            else:
                value = await asyncio.to_thread(functools.partial(tool.fn, **kwargs))
            text = shape(value)
            cache.put(key, text)  # a repeat gets the text: its trust is then the tool's declaration
            fut.set_result(text)
            return ToolOutput(text, value.untrusted) if isinstance(value, ToolOutput) else text
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters re-raise, nobody else must
            raise
        finally:
            inflight.pop(key, None)

    return Tool(
        name=tool.name, description=tool.description, parameters=tool.parameters, fn=run,
        validator=tool.validator, effect=tool.effect, untrusted_output=tool.untrusted_output,
        timeout=tool.timeout, max_result_chars=tool.max_result_chars, context_param=param,
        metadata={**{k: v for k, v in tool.metadata.items() if k not in LEGACY_KEYS}, "idempotent": True},
        declares=tool.declared,
    )
