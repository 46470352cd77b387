"""`ToolContext`: the per-call facts the executor hands a tool that asks for them, and `CancelSignal`,
how a call learns that it was cancelled."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tether.tools._extra import Extras, RunFacts, bound_extras


class CancelSignal:
    """Set once when a call is cancelled; safe to read, wait on and set from any thread.

    Like `threading.Event`: `is_set()`, `wait(timeout)`. `on_cancel(fn)` runs `fn()` once when the
    signal is set (at once, in the caller's thread, if it already is; otherwise in the thread that
    sets it, so keep `fn` short, e.g. killing a process) and returns a function that removes it.
    """

    __slots__ = ("_callbacks", "_event", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the signal is set or `timeout` seconds pass; returns whether it is set."""
        return self._event.wait(timeout)

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # one failing callback must not keep the others (or the canceller) from running
                logging.getLogger(__name__).exception("cancel callback %r failed", fn)

    def on_cancel(self, fn: Callable[[], object]) -> Callable[[], None]:
        with self._lock:
            pending = not self._event.is_set()
            if pending:
                self._callbacks.append(fn)
        if not pending:
            fn()

        def remove() -> None:
            with self._lock:
                if fn in self._callbacks:
                    self._callbacks.remove(fn)

        return remove


@dataclass(slots=True)
class ToolContext:
    """Per-call facts a tool may ask for by annotating a parameter with this type.

    `cancel_event` is set when the call is cancelled: its run was cancelled (a `CancelToken`, Ctrl-C,
    the run's task cancelled) or the call timed out and was abandoned. An async tool is also cancelled
    the asyncio way; a sync tool runs in a thread nothing can stop, so a long one should check
    `ctx.cancelled` (or `ctx.cancel_event.wait(seconds)`) between pieces of work and return or raise
    when it is set; a subprocess started with `tether.tools.run_process(argv, ctx)` is killed then.
    A sync tool still running a short grace after the cancel is abandoned and reported as left running.
    """

    run_id: str
    call_id: str
    user: str | None = None
    idempotency_key: str = ""
    extra: Extras = field(default_factory=Extras)  # the caller's own values (`ExtraKey`s), as the policy sees them
    cancel_event: CancelSignal = field(default_factory=CancelSignal)
    # its arguments carry untrusted hidden values (tether.values): a sub-agent given them starts tainted
    untrusted_args: bool = False
    run: RunFacts = field(default_factory=RunFacts)  # tether's own facts about the run (its parent, jobs, ...)

    def __post_init__(self) -> None:
        self.extra = bound_extras(self.extra, self.run, "ToolContext")  # a dict (the old form) still works

    @property
    def cancelled(self) -> bool:
        """Whether this call was cancelled (see `cancel_event`)."""
        return self.cancel_event.is_set()
