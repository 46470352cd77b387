"""Retries with exponential backoff and jitter, and one total deadline, shared by the HTTP model adapters.

The SDKs' own retries are switched off (max_retries=0) so that the policy here is the only one:
its delays can be made tiny in tests, and it ends in one `ModelError` with a one-line reason.
The SDKs' timeouts bound each read, so a server trickling a byte every few seconds never trips
them. Two bounds here do: `RetryPolicy.idle_timeout` bounds each wait for progress counted in
whole units (a complete reply, the stream's response, each complete stream event), so a trickle of
bytes that never completes one is a stall, retried like a timeout; `RetryPolicy.deadline` bounds
the whole call (every attempt, every backoff, every chunk).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tether._errors import InvalidInput
from tether._types import ModelReply, TextDelta
from tether.models._base import ModelError

T = TypeVar("T")
DEFAULT_DEADLINE = 120.0  # seconds for one model call, retries included
DEFAULT_IDLE_TIMEOUT = 60.0  # seconds one attempt may wait for its next unit of progress


@dataclass(frozen=True, slots=True)
class Failure:
    """How an adapter classifies an exception: can it be retried, and what to tell the user."""

    retryable: bool
    message: str  # one line: "HTTP 500: <provider message>", "connection error: ..."
    retry_after: float | None = None  # seconds the server asked us to wait


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`max_retries` retries after the first attempt; delay base * 2**n, capped, with jitter.

    A server's Retry-After is honoured up to `max_retry_after` seconds; a longer one ends the
    call at once rather than stalling a run for minutes. `deadline` (None: none) is the total
    time one call may take, attempts, backoff and streamed chunks included. `idle_timeout`
    (None: none) is the longest one attempt waits for progress: a whole reply (not streamed), or
    the stream's response and then each complete stream event; bytes that complete none do not count.
    """

    max_retries: int = 3
    backoff_base: float = 0.5
    backoff_max: float = 8.0
    max_retry_after: float = 60.0
    deadline: float | None = None
    idle_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise InvalidInput(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_base < 0 or self.backoff_max < 0:
            raise InvalidInput("backoff_base and backoff_max must be >= 0")
        if self.deadline is not None and not self.deadline > 0:
            raise InvalidInput(f"deadline must be > 0 seconds (or None), got {self.deadline}")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise InvalidInput(f"idle_timeout must be > 0 seconds (or None), got {self.idle_timeout}")

    def delay(self, retry: int, failure: Failure) -> float | None:
        """Seconds to wait before retry number `retry` (0-based), or None to give up."""
        if not failure.retryable or retry >= self.max_retries:
            return None
        if failure.retry_after is not None:
            if failure.retry_after > self.max_retry_after:
                return None
            return max(0.0, failure.retry_after)
        backoff = min(self.backoff_max, self.backoff_base * (2.0**retry))
        return backoff * (0.5 + 0.5 * random.random())  # jitter spreads clients that failed together


def give_up(prefix: str, failure: Failure, attempts: int, policy: RetryPolicy) -> ModelError:
    """The final error: one line with the provider, the reason and how many attempts were made."""
    tail = ""
    if failure.retryable and failure.retry_after is not None and failure.retry_after > policy.max_retry_after:
        tail = f" (server asked to retry after {failure.retry_after:g}s, over the {policy.max_retry_after:g}s limit)"
    elif attempts > 1:
        tail = f" (gave up after {attempts} attempts)"
    return ModelError(f"{prefix}: {failure.message}{tail}", retryable=failure.retryable)


def past_deadline(prefix: str, policy: RetryPolicy, last: Failure | None, emitted: bool = False) -> ModelError:
    """The error for a call that ran out of its total deadline."""
    tail = f" (last error: {last.message})" if last is not None else ""
    if emitted:
        tail += " (stream broke after text was sent)"
    # retryable: a hung provider is worth another model (FallbackModel), and a later attempt
    return ModelError(f"{prefix}: no complete reply within the {policy.deadline:g}s deadline for one model call{tail}",
                      retryable=True)


class _Stalled(Exception):
    """No progress within the idle timeout; `failure` says which wait stalled (retryable, as a timeout is)."""

    def __init__(self, what: str, idle: float) -> None:
        super().__init__(what)
        self.failure = Failure(True, f"stalled: {what} within the {idle:g}s idle timeout")


class _Clock:
    """The call's end time on the event loop's clock; `within` bounds one await by it and by the
    idle timeout, whichever ends first (one timer per await: a stream awaits once per chunk)."""

    __slots__ = ("end", "idle")

    def __init__(self, policy: RetryPolicy) -> None:
        self.idle = policy.idle_timeout
        self.end = None if policy.deadline is None else asyncio.get_running_loop().time() + policy.deadline

    async def within(self, aw: Awaitable[T], what: str) -> T:
        """Await `aw`; TimeoutError at the deadline, _Stalled(what) when the idle timeout ends first."""
        end, stall = self.end, False
        if self.idle is not None:
            idle_end = asyncio.get_running_loop().time() + self.idle
            if end is None or idle_end < end:
                end, stall = idle_end, True
        if end is None:
            return await aw
        bound = asyncio.timeout_at(end)
        try:
            async with bound:
                return await aw
        except TimeoutError:
            if stall and bound.expired():
                assert self.idle is not None
                raise _Stalled(what, self.idle) from None
            raise

    def allows(self, wait: float) -> bool:
        return self.end is None or asyncio.get_running_loop().time() + wait < self.end


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    classify: Callable[[Exception], Failure | None],
    prefix: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Await `fn()`, retrying failures `classify` calls retryable; raise ModelError at the end
    (also when `policy.deadline` runs out, whatever the server is doing meanwhile). An attempt
    whose reply is not complete within `policy.idle_timeout` is a stall, retried like a timeout.

    Exceptions `classify` does not recognise (returns None for) propagate unchanged: they are
    bugs, not provider trouble.
    """
    clock = _Clock(policy)
    retry = 0
    last: Failure | None = None
    while True:
        try:
            return await clock.within(fn(), "no complete reply")
        except TimeoutError as exc:
            if clock.end is None:
                raise
            raise past_deadline(prefix, policy, last) from exc
        except Exception as exc:
            failure = exc.failure if isinstance(exc, _Stalled) else classify(exc)
            if failure is None:
                raise
            wait = policy.delay(retry, failure)
            if wait is None:
                raise give_up(prefix, failure, retry + 1, policy) from exc
            if not clock.allows(wait):
                raise past_deadline(prefix, policy, failure) from exc
            last = failure
        retry += 1
        await sleep(wait)


class StreamAccumulator(Protocol):
    """Accumulates one provider's stream events into text deltas and a final reply."""

    def add(self, event: Any, /) -> str | None: ...

    def reply(self) -> ModelReply: ...


async def stream_with_retries(
    open_stream: Callable[[], Awaitable[Any]],
    new_state: Callable[[], StreamAccumulator],
    policy: RetryPolicy,
    classify: Callable[[Exception], Failure | None],
    prefix: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncIterator[TextDelta | ModelReply]:
    """Yield text deltas, then one ModelReply. Failures before the first delta are retried like
    `call_with_retries`; once text was yielded a broken stream raises ModelError (the caller has
    already shown that text). `policy.deadline` bounds the whole stream, each chunk's wait included;
    `policy.idle_timeout` bounds the wait for the response and for each complete event (the SDK
    yields an event only once its bytes are all in, and drops keep-alive comments and pings)."""
    clock = _Clock(policy)
    retry = 0
    last: Failure | None = None
    while True:
        emitted = False
        try:
            events = await clock.within(open_stream(), "no response")
            state = new_state()
            try:
                chunks = events.__aiter__()
                while True:
                    try:
                        event = await clock.within(chunks.__anext__(), "no stream event")
                    except StopAsyncIteration:
                        break
                    text = state.add(event)
                    if text:
                        emitted = True
                        yield TextDelta(text)
            finally:
                await events.close()
            yield state.reply()
            return
        except TimeoutError as exc:
            if clock.end is None:
                raise
            raise past_deadline(prefix, policy, last, emitted) from exc
        except Exception as exc:
            failure = exc.failure if isinstance(exc, _Stalled) else classify(exc)
            if failure is None:
                raise
            if emitted:
                raise ModelError(f"{prefix}: {failure.message} (stream broke after text was sent)") from exc
            wait = policy.delay(retry, failure)
            if wait is None:
                raise give_up(prefix, failure, retry + 1, policy) from exc
            if not clock.allows(wait):
                raise past_deadline(prefix, policy, failure) from exc
            last = failure
        retry += 1
        await sleep(wait)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date), if present."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return float(value) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def one_line(text: str, limit: int = 300) -> str:
    """Collapse whitespace and cap the length, so an error message stays on one line."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def provider_message(body: object) -> str | None:
    """The human message inside a provider's error body: {"error": {"message": ...}} and kin."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail")
            if msg:
                return str(msg)
        elif isinstance(err, str) and err:
            return err
        if body.get("message"):
            return str(body["message"])
        if body.get("detail"):
            return str(body["detail"])
    elif isinstance(body, str) and body:
        return body
    return None


def classify_sdk_error(sdk: Any, base_error: type[Exception], exc: Exception, timeout: float | None) -> Failure | None:
    """Sort an exception from a Stainless-generated SDK (openai, anthropic: same exception tree)
    into retryable or not: timeouts, connection errors, 408, 429 and 5xx retry."""
    err: Any = exc  # the SDK's classes are only known at run time: their attributes too
    if isinstance(exc, sdk.APITimeoutError):
        return Failure(True, f"request timed out after {timeout:g}s" if timeout else "request timed out")
    if isinstance(exc, sdk.APIConnectionError):
        return Failure(True, one_line(f"connection error: {exc.__cause__ or err.message}"))
    if isinstance(exc, sdk.APIStatusError):
        status = err.status_code
        message = provider_message(err.body) or err.message
        retryable = status in (408, 429) or status >= 500
        return Failure(retryable, one_line(f"HTTP {status}: {message}"), parse_retry_after(err.response.headers))
    if isinstance(exc, base_error):
        return Failure(False, one_line(f"{type(exc).__name__}: {exc}"))
    return None
