"""An SDK client per event loop, for the HTTP model clients."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any


class LoopClient:
    """One SDK client per event loop: an httpx pool is tied to the loop that opened its connections,
    and a synchronous `Agent.run` runs each run on a fresh loop. `make` builds a client.

    The client is closed on its own loop before that loop ends: `aclose`, or else `asyncio.run`'s
    shutdown of async generators (a generator started with the client closes it there). Left open, the
    SDK closed it when it was collected, from the next loop, and printed 'Event loop is closed'."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closer: AsyncGenerator[None, None] | None = None

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = client = self._make()
            self._loop = loop
            self._closer = _closing(client)
            step = self._closer.asend(None)  # registers it with this loop (its shutdown_asyncgens closes it)
            with contextlib.suppress(StopIteration):  # it yields at once: the first step is done here
                step.send(None)
        return self._client

    async def aclose(self) -> None:
        """Close the client this event loop opened (so no connection is left to close on a closed loop)."""
        closer, self._closer = self._closer, None
        self._client = None
        if closer is not None and self._loop is asyncio.get_running_loop():
            await closer.aclose()
        self._loop = None


async def _closing(client: Any) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await client.close()
