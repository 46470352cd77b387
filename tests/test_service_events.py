"""The task service's event streams without HTTP, over a real run store (SQLite and PostgreSQL):
every SSE event is derived from stored rows, so resuming after any event id gives exactly the rest;
streamed text comes before the event of the model call that wrote it; a model call that ran again
after a crash marks its text `restart`; one feed query per tick serves every open stream; and the
submission rate limit is shared by every process on the database."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import sqlalchemy as sa
from hang import HANG
from store_fixtures import fresh_postgres_database

from tether._types import TraceEvent
from tether.durable._text_deltas import TextDeltaWriter
from tether.server._events import Feed, stream
from tether.server._keys import ServiceTables
from tether.store import RunStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = RunStore(str(tmp_path / "runs.db"))
        yield s
        s.close()
        return
    for url in fresh_postgres_database():
        s = RunStore(url)
        yield s
        s.close()


def _event(kind: str, **data) -> TraceEvent:
    return TraceEvent(kind, 1, 0.0, 0.0, data)


def _history(store: RunStore, run_id: str = "r1") -> None:
    """A finished run: a model call that streamed text and called a tool, an approval, a restarted
    final model call (an earlier attempt streamed before a crash), the stop."""
    store.create_run(run_id, "agent", "alice", "go")
    store.add_text_deltas(run_id, 0, 0, ["Let me ", "look."])
    store.add_events(run_id, [_event("model_call", tool_calls=1),
                              _event("tool_call", call_id="c1", name="charge", arguments={"amount": 5},
                                     decision="awaiting_approval")], 0)
    store.add_events(run_id, [_event("notice", approval={"call_id": "c1", "approved": True})], 2)
    store.add_text_deltas(run_id, 3, 0, ["Do", "ne: cha"])
    store.add_text_deltas(run_id, 3, 2, ["Done: charged 5"], restart=True)
    store.add_events(run_id, [_event("model_call", tool_calls=0), _event("stop", stop_reason="completed")], 3)
    store.set_status(run_id, "completed")
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE tether_runs SET answer = 'Done: charged 5' WHERE run_id = :r"), {"r": run_id})


async def _collect(store: RunStore, run_id: str, last: str | None = None, feed: Feed | None = None,
                   limit: int | None = None) -> list[dict]:
    feed = feed or Feed(store, tick=0.02)
    out = []
    async for item in stream(store, feed, run_id, last):
        out.append({**item, "data": json.loads(item["data"])})
        if limit is not None and len(out) >= limit:
            break
    return out


def test_the_stream_of_a_finished_run_and_every_resume(store: RunStore) -> None:
    _history(store)
    full = asyncio.run(_collect(store, "r1"))
    names = [e["event"] for e in full]
    assert names == ["status", "text_delta", "text_delta", "model_call", "tool_call", "confirm_request", "status",
                     "status", "text_delta", "text_delta", "text_delta", "model_call", "answer", "stop"]
    assert [e["id"] for e in full[:4]] == ["0.0", "0.1", "0.2", "0.3"]
    final = [e["data"] for e in full if e["event"] == "text_delta" and e["id"].startswith("3.")]
    assert final == [{"text": "Do"}, {"text": "ne: cha"}, {"text": "Done: charged 5", "restart": True}]
    assert full[-2]["data"] == {"answer": "Done: charged 5", "stop_reason": "completed"}
    for i, seen in enumerate(full):  # Last-Event-ID after any event: exactly the rest
        assert asyncio.run(_collect(store, "r1", seen["id"])) == full[i + 1:], seen["id"]
    assert asyncio.run(_collect(store, "r1", "garbage")) == full  # a malformed id starts over
    assert asyncio.run(asyncio.wait_for(_collect(store, "r1", "99.0"), HANG)) == []  # past the end: it ends


def test_live_text_then_the_event_it_precedes(store: RunStore) -> None:
    """A reader sees text pieces as they are written, before the model call's event exists."""
    store.create_run("r2", "agent", "alice", "go")
    store.set_status("r2", "running")

    async def scenario() -> list[dict]:
        feed = Feed(store, tick=0.02)
        got: list[dict] = []

        async def read() -> None:
            async for item in stream(store, feed, "r2", None):
                got.append({"id": item["id"], "event": item["event"], "data": json.loads(item["data"])})

        reader = asyncio.ensure_future(read())
        writer = TextDeltaWriter(store, "r2", batch_seconds=0.0)
        for piece in ["The ", "answer ", "is 42."]:
            before = len(got)
            writer.add(0, piece)
            await _until(lambda: len(got) > before)  # noqa: B023 (awaited at once)
        assert [e["event"] for e in got] == ["status", "text_delta", "text_delta", "text_delta"]
        store.add_events("r2", [_event("model_call"), _event("stop", stop_reason="completed")], 0)
        await asyncio.wait_for(reader, HANG)
        return got

    got = asyncio.run(scenario())
    assert [e["id"] for e in got] == ["0.0", "0.1", "0.2", "0.3", "0.4", "1.0", "1.1"]
    assert "".join(e["data"]["text"] for e in got if e["event"] == "text_delta") == "The answer is 42."


async def _until(condition, timeout: float = HANG) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def test_a_restarted_model_call_continues_after_the_earlier_attempt(store: RunStore) -> None:
    store.create_run("r3", "agent", "alice", "go")
    first = TextDeltaWriter(store, "r3", batch_seconds=60)  # the first piece at once, then batches
    first.add(0, "Hel")
    first.add(0, "lo")
    first.flush()
    first.add(0, " wor")  # pending when the process died: never written
    again = TextDeltaWriter(store, "r3", batch_seconds=60)  # the next process runs the call again
    again.add(0, "Hello")
    again.add(0, " world")
    again.flush()
    with store.engine.connect() as conn:
        rows = list(conn.execute(sa.text("SELECT idx, text, restart FROM tether_text_deltas WHERE run_id = 'r3' "
                                         "ORDER BY idx")))
    assert [tuple(r) for r in rows] == [(0, "Hel", 0), (1, "lo", 0), (2, "Hello", 1), (3, " world", 0)]


def test_a_run_ended_without_a_stop_event_gets_one_stored(store: RunStore) -> None:
    """Cancelled while parked: the stream stores the stop (keyed by seq), so a later reader sees the same."""
    store.create_run("r4", "agent", "alice", "go")
    store.add_events("r4", [_event("model_call")], 0)
    store.set_status("r4", "cancelled")
    first = asyncio.run(_collect(store, "r4"))
    assert [e["event"] for e in first] == ["status", "model_call", "answer", "stop"]
    assert first[-1]["id"] == "1.1" and first[-1]["data"]["stop_reason"] == "cancelled"
    store.add_events("r4", [_event("notice", cancelled="late"), _event("stop", stop_reason="cancelled")], 1)
    assert asyncio.run(_collect(store, "r4")) == first  # the run's own late events change nothing seen
    assert asyncio.run(asyncio.wait_for(_collect(store, "r4", "50.0"), HANG)) == []  # an id from elsewhere
    with store.engine.connect() as conn:
        seqs = [q for (q,) in conn.execute(sa.text("SELECT seq FROM tether_events WHERE run_id = 'r4' ORDER BY seq"))]
    assert seqs == [0, 1, 2]  # and it wrote nothing there


def test_one_feed_query_per_tick_for_many_streams(tmp_path, monkeypatch) -> None:
    """50 idle streams cost one query per feed tick, not one per stream. Counted per tick, with the
    moments waited for as events (every stream has read once; ten ticks have passed), so a slow
    machine changes how long it takes, never what is counted (it once failed under load: 64 > 25
    statements in a wall-clock second that also held first reads)."""
    import tether.server._events as events_mod

    monkeypatch.setattr(events_mod, "IDLE_RECHECK_SECONDS", 3600.0)  # no belt-and-braces re-read in the window
    store = RunStore(str(tmp_path / "runs.db"))
    for i in range(50):
        store.create_run(f"w{i}", "agent", "alice", "go")
        store.set_status(f"w{i}", "running")
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda conn, cur, sql, *a: statements.append(sql))
    reads: list[str] = []  # one entry per stream read
    polls: list[int] = []  # one entry per feed tick

    async def call(fn, *args):
        if fn is events_mod.read_from:
            reads.append(args[1])
        else:
            polls.append(len(args[0]))
        return await asyncio.to_thread(fn, *args)

    async def until(check, what: str) -> None:
        for _ in range(int(HANG / 0.01)):  # only a hang ends it: a guard, not a measure
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    async def scenario() -> tuple[int, int, int]:
        feed = Feed(store, call=call, tick=0.05)
        readers = [asyncio.ensure_future(_collect(store, f"w{i}", feed=feed)) for i in range(50)]
        await until(lambda: len(set(reads)) == 50, "every stream's first read")
        # The feed's first sight of each run wakes its stream once; settled when two ticks pass unread.
        for _ in range(20):
            r, p = len(reads), len(polls)
            await until(lambda p=p: len(polls) >= p + 2, "two feed ticks")
            if len(reads) == r:
                break
        else:
            raise AssertionError(f"the streams never settled: {len(reads)} reads in {len(polls)} ticks")
        s0, p0, r0 = len(statements), len(polls), len(reads)
        await until(lambda: len(polls) >= p0 + 10, "ten more feed ticks")
        idle = (len(statements) - s0, len(polls) - p0, len(reads) - r0)
        store.add_events("w7", [_event("stop", stop_reason="completed")], 0)
        await asyncio.wait_for(readers[7], HANG)
        for r in readers:
            r.cancel()
        return idle

    statements_idle, ticks, stream_reads = asyncio.run(scenario())
    assert stream_reads == 0  # no stream asked on its own
    # one query per tick (a tick counted as it starts, its query a moment later: one either way at the edges)
    assert ticks - 1 <= statements_idle <= ticks + 1, (statements_idle, ticks)
    store.close()


def test_submission_rate_is_shared_across_processes(store: RunStore) -> None:
    a, b = ServiceTables(store.engine), ServiceTables(RunStore(store.url).engine)  # two API processes
    t0 = 16_667 * 60 + 20.0  # 20 s into a minute
    decisions = [(a if i % 2 else b).take_submission("alice", 5, now=t0 + i) for i in range(7)]
    assert decisions[:5] == [None] * 5 and all(d is not None for d in decisions[5:])
    assert a.take_submission("bob", 5, now=t0) is None  # per user
    # the next minute: at 30 s in, half of the last minute's 5 still counts (2.5), so 2 more fit
    t1 = t0 - 20 + 60 + 30
    assert [a.take_submission("alice", 5, now=t1) for _ in range(3)] == [None, None, pytest.approx(
        6.0)]


def test_refused_and_stale_idempotency_claims_free_the_key(store: RunStore) -> None:
    tables = ServiceTables(store.engine)
    body = {"prompt": "x", "agent": "calc"}
    assert tables.claim_submission("u", "k1", body, "t_a") == ("t_a", True, False)
    assert tables.claim_submission("u", "k1", body, "t_b") == ("t_a", True, False)  # in flight: not created yet
    tables.release_submission("u", "k1", "t_a")  # its request was refused
    assert tables.claim_submission("u", "k1", body, "t_c") == ("t_c", True, False)
    store.create_run("t_c", "calc", "u", "x")
    assert tables.claim_submission("u", "k1", body, "t_d") == ("t_c", True, True)
    with store.engine.begin() as conn:  # a claim whose request died before creating its task, long ago
        conn.execute(sa.text("INSERT INTO tether_task_keys (user_id, key, body_hash, task_id, created_at) "
                             "VALUES ('u', 'k2', 'h', 't_dead', 0)"))
    assert tables.claim_submission("u", "k2", body, "t_e") == ("t_e", True, False)


def test_heartbeats_are_judged_by_the_database_clock(store: RunStore, monkeypatch) -> None:
    import tether.server._keys as keys

    tables = ServiceTables(store.engine)
    tables.beat("a")
    tables.beat("b")
    # this machine's clock an hour off (another machine's beats are compared with the same database clock)
    ahead = keys.time.time() + 3600
    monkeypatch.setattr(keys.time, "time", lambda: ahead)
    assert tables.silent_workers(5, "me") == []
    with store.engine.begin() as conn:  # a's last beat 20 s ago by the database's clock
        conn.execute(sa.text("UPDATE tether_workers SET beat_at = beat_at - 20 WHERE executor_id = 'a'"))
    assert tables.silent_workers(5, "me") == ["a"]
    assert tables.silent_workers(5, "me") == []  # taken off the list
    tables.beat("b")
    assert tables.silent_workers(5, "b") == []  # a worker never judges itself


class _Beats:
    """ServiceTables' heartbeat side for the janitor: each beat moves a fake clock 2 s on; the beats
    in `down` fail (the database is away); after `last` beats the janitor is stopped."""

    def __init__(self, down: range = range(0), last: int = 20) -> None:
        self.now, self.n, self.down, self.last = 0.0, 0, down, last
        self.adopted_at: list[int] = []

    def beat(self, executor_id: str) -> None:
        self.n += 1
        self.now += 2.0
        if self.n > self.last:
            raise asyncio.CancelledError
        if self.n in self.down:
            raise ConnectionError("database away")

    def silent_workers(self, older_than: float, me: str) -> list[str]:
        return ["other"]


def _janitor(beats: _Beats) -> list[int]:
    from tether.server._janitor import heartbeat_and_janitor

    def recover(executor_id: str) -> list:
        beats.adopted_at.append(beats.n)
        return []

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(heartbeat_and_janitor(beats, "me", beat=2, dead_after=10, recover=recover,
                                          clock=lambda: beats.now, sleep=lambda _: asyncio.sleep(0)))
    return beats.adopted_at


def test_the_janitor_adopts_only_after_its_own_beats_landed_for_dead_after() -> None:
    assert _janitor(_Beats(last=8))[:1] == [5]  # 10 s of its own beats first
    # the database was away for beats 3-9: every worker looked silent, none was dead
    adopted = _janitor(_Beats(down=range(3, 10), last=20))
    assert adopted and adopted[0] == 15  # not at 10 (the first beat back): 10 s of beats again first
