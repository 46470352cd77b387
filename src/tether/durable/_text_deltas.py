"""`TextDeltaWriter`: a durable run's streamed text, written to the run store in small batches so
another process (the task service's event streams) can show it as it arrives.

Each piece is keyed by the stored event it precedes (`seq`: the model call's event, written when the
call ends) and its index there. A model call that runs again after a crash finds the pieces of its
earlier attempt and goes on after them, its first piece marked `restart` (so a reader knows to drop
the text shown since the last event); nothing written is ever changed, so a reader resuming at any
piece reads the same sequence."""

from __future__ import annotations

import time
from collections.abc import Callable

from tether.store._sql import RunStore

BATCH_SECONDS = 0.05


class TextDeltaWriter:
    """Collects one run's text deltas and writes them at most every `batch_seconds` (and at `flush`)."""

    def __init__(self, store: RunStore, run_id: str, *, batch_seconds: float = BATCH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.run_id = run_id
        self.batch_seconds = batch_seconds
        self.clock = clock
        self.seq = -1
        self.next_idx = 0
        self.restart = False
        self.pending: list[str] = []
        self.written_at = 0.0

    def add(self, seq: int, text: str) -> None:
        """A piece of the text streamed before stored event `seq`."""
        if not text:
            return
        if seq != self.seq:
            self.flush()
            self.seq = seq
            self.next_idx = self.store.next_text_delta(self.run_id, seq)
            self.restart = self.next_idx > 0  # an earlier attempt of this call streamed already
        self.pending.append(text)
        if self.clock() - self.written_at >= self.batch_seconds:
            self.flush()

    def flush(self) -> None:
        """Write what is pending (one row)."""
        if not self.pending:
            return
        self.store.add_text_deltas(self.run_id, self.seq, self.next_idx, ["".join(self.pending)], restart=self.restart)
        self.next_idx += 1
        self.restart = False
        self.pending.clear()
        self.written_at = self.clock()
