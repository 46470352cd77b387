"""The one protocol every model adapter implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from tether._errors import TetherError
from tether._types import ModelReply, ModelRequest, TextDelta


class ModelError(TetherError, RuntimeError):
    """A model call failed for good (after the adapter's own retries).

    `retryable` says whether the failure was of a kind worth retrying (5xx, 429, timeouts,
    connection errors) that the retry layer gave up on; False for errors a retry cannot fix (a
    bad request, auth); None when the adapter does not know. `FallbackModel` keys on it.
    """

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable


@runtime_checkable
class Model(Protocol):
    """An LLM behind one async interface.

    `complete` returns the whole reply. `stream` yields `TextDelta`s as text arrives and then
    exactly one final `ModelReply` (with tool calls and usage).
    """

    name: str

    async def complete(self, request: ModelRequest) -> ModelReply: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]: ...


async def stream_by_completing(model: Model, request: ModelRequest) -> AsyncIterator[TextDelta | ModelReply]:
    """A `stream` for adapters that cannot stream: one delta with the whole text, then the reply."""
    reply = await model.complete(request)
    if reply.text:
        yield TextDelta(reply.text)
    yield reply
