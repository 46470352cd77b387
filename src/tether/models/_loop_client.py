"""An SDK client per event loop, for the HTTP model clients."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class LoopClient:
    """One SDK client per event loop: an httpx pool is tied to the loop that opened its connections,
    and a synchronous `Agent.run` runs each run on a fresh loop. `make` builds a client."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._make()
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the client this event loop opened (so no connection is left to close on a closed loop)."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.close()
        self._loop = None
