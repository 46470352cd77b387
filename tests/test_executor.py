"""Every executor path: unknown tool, malformed and invalid arguments, failures, timeouts, capping."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from hang import HANG

from tether import BasePolicy, ToolContext, tool
from tether._types import Effect, ToolCall
from tether.tools import RunFacts
from tether.tools._base import Tool
from tether.tools._executor import CallContext, Executor
from tether.tools._results import ResultStore, cap, shape

CTX = CallContext(run_id="run1", user="alice")


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


@tool(timeout=0.05)
async def slow_async(x: int) -> int:
    """Too slow."""
    await asyncio.sleep(5)
    return x


@tool(timeout=0.05)
def slow_sync(x: int) -> int:
    """Too slow, in a thread."""
    time.sleep(0.5)
    return x


@tool
def big(n: int) -> str:
    """A big output."""
    return "".join(str(i % 10) for i in range(n))


def run(ex: Executor, name: str, **args):
    return asyncio.run(ex.execute(ToolCall("c1", name, args), CTX))


def test_unknown_tool_lists_the_available_ones():
    r = run(Executor([divide]), "multiply", a=1)
    assert r.is_error and r.decision == "unknown_tool"
    assert r.content == "ERROR: unknown tool 'multiply'. Available tools: divide, read_result."


def test_malformed_arguments_from_the_model():
    ex = Executor([divide])
    r = asyncio.run(ex.execute(ToolCall("c1", "divide", {}, parse_error="arguments were not valid JSON"), CTX))
    assert r.is_error and r.decision == "invalid_arguments"
    assert "not valid JSON" in r.content and "call it again" in r.content.lower()


def test_validation_error_names_field_expected_and_got_and_says_retry():
    r = run(Executor([divide]), "divide", a="ten", b=2)
    assert r.is_error and r.decision == "invalid_arguments"
    assert "'a'" in r.content and "valid number" in r.content and "'ten'" in r.content
    assert "call the tool again" in r.content
    r = run(Executor([divide]), "divide", a=1)
    assert "'b' is required" in r.content
    r = run(Executor([divide]), "divide", a=1, b=2, c=3)
    assert "'c' is not a parameter" in r.content


def test_exception_becomes_an_actionable_error():
    r = run(Executor([divide]), "divide", a=1, b=0)
    assert r.is_error and r.decision == "failed"
    assert r.content == "ERROR: tool failed - ZeroDivisionError: float division by zero"


@pytest.mark.parametrize("name", ["slow_async", "slow_sync"])
def test_timeouts(name):
    r = run(Executor([slow_async, slow_sync]), name, x=1)
    assert r.is_error and r.decision == "timeout"
    assert "timed out after 0.05 s" in r.content


def test_run_time_budget_bounds_the_tool_timeout():
    ex = Executor([dataclasses.replace(slow_async, timeout=100)])
    r = asyncio.run(ex.execute(ToolCall("c", "slow_async", {"x": 1}), CallContext("r", seconds_left=0.05)))
    assert r.decision == "timeout"


def test_big_results_are_capped_with_a_handle_and_paged_by_read_result():
    ex = Executor([big], max_result_chars=100)
    r = run(ex, "big", n=1000)
    h = r.handle
    assert not r.is_error and h is not None and h.startswith("r_") and len(h) == 18 and r.full_chars == 1000
    assert r.content.startswith("0123456789" * 10)
    assert f'read_result(handle="{h}", offset=100, length=100)' in r.content
    page = run(ex, "read_result", handle=h, offset=100, length=50)
    assert page.content.startswith("0123456789" * 5 + "\n[characters 100-150 of 1000. Next: offset=150.]")
    last = run(ex, "read_result", handle=h, offset=990, length=100)
    assert last.content.endswith("End of result.]")
    missing = run(ex, "read_result", handle="r9")
    assert missing.is_error and "unknown or expired" in missing.content
    # another run (or another user) cannot read it, even knowing the handle
    other = asyncio.run(ex.execute(ToolCall("c2", "read_result", {"handle": h}), CallContext("run2", user="alice")))
    assert other.is_error and "unknown or expired" in other.content
    bob = asyncio.run(ex.execute(ToolCall("c3", "read_result", {"handle": h}),
                                 CallContext("run1", user="bob", run=RunFacts(handles={h}))))
    assert bob.is_error


def test_result_store_is_bounded():
    store = ResultStore(max_total_chars=250)
    handles = [store.put("x" * 100) for _ in range(5)]
    assert store.total_chars <= 250 and len(store) == 2
    assert store.get(handles[0]) is None and store.get(handles[-1]) == "x" * 100
    later = [store.put(str(i % 10) * 100) for i in range(50)]  # the file on disk stays bounded too
    assert store.file_bytes <= 2 * 250
    assert store.get(later[-1]) == "9" * 100 and store.get(later[-2]) == "8" * 100
    assert store.get(later[-1], owner="bob") is None  # another user's result
    text, handle = cap("short", 10, store)
    assert (text, handle) == ("short", None)


def test_shape():
    assert shape(None) == "(no output)"
    assert shape({"a": [1, 2]}) == '{"a": [1, 2]}'
    assert shape(b"\x00\x01") == "(binary output, 2 bytes, not shown)"


def test_context_parameter_gets_the_idempotency_key_and_is_hidden():
    seen: list[ToolContext] = []

    @tool(effect=Effect.IRREVERSIBLE)
    def pay(amount: int, ctx: ToolContext) -> str:
        """Pay."""
        seen.append(ctx)
        return "paid"

    assert "ctx" not in pay.parameters["properties"]
    r = run(Executor([pay]), "pay", amount=3)
    assert r.content == "paid"
    assert seen[0].idempotency_key == "run1:0:0" and seen[0].user == "alice"  # run_id:step:index


def test_tools_from_explicit_json_schema_are_validated():
    t = Tool.from_schema(
        "send", "Send.",
        {"properties": {"to": {"type": "string", "pattern": "^[a-z]+$"},
                        "n": {"type": "integer", "minimum": 1, "default": 1}},
         "required": ["to"], "additionalProperties": False},
        lambda to, n: f"{to}:{n}",
    )
    ex = Executor([t])
    assert run(ex, "send", to="bob").content == "bob:1"
    bad = run(ex, "send", to="Bob!", n=0)
    assert "must match pattern" in bad.content and "must be >= 1" in bad.content


def test_duplicate_tool_names_are_refused():
    with pytest.raises(ValueError, match="unique"):
        Executor([divide, divide])


def test_read_result_is_advertised_once_a_result_was_capped():
    ex = Executor([big], max_result_chars=100)
    ctx = CallContext("run1", user="alice")
    owned = lambda: bool(ctx.run.handles)  # noqa: E731 - what the loop asks
    assert [s.name for s in ex.specs_for(owned())] == ["big"]
    assert run(ex, "read_result", handle="r1").is_error  # callable all along, just not advertised
    asyncio.run(ex.execute(ToolCall("c1", "big", {"n": 50}), ctx))
    assert [s.name for s in ex.specs_for(owned())] == ["big"]
    asyncio.run(ex.execute(ToolCall("c2", "big", {"n": 1000}), ctx))
    assert [s.name for s in ex.specs_for(owned())] == ["big", "read_result"]


class _RaisingPolicy(BasePolicy):
    def __init__(self, where: str) -> None:
        self.where = where

    async def before_call(self, tool, args, call, ctx):
        if self.where == "before":
            raise RuntimeError("policy store is down")
        from tether.tools._executor import ALLOW

        return ALLOW

    def after_call(self, tool, result, ctx):
        if self.where == "after":
            raise RuntimeError("taint label failed")
        return result


def test_a_policy_that_raises_fails_closed_instead_of_crashing_the_run():
    ran: list[int] = []

    @tool
    def effect(x: int) -> str:
        """Has an effect."""
        ran.append(x)
        return "secret output"

    before = run(Executor([effect], policy=_RaisingPolicy("before")), "effect", x=1)
    assert before.is_error and before.decision == "refused:policy_error" and ran == []
    assert "policy check failed - RuntimeError: policy store is down" in before.content
    after = run(Executor([effect], policy=_RaisingPolicy("after")), "effect", x=2)
    assert after.is_error and after.decision == "withheld:policy_error" and ran == [2]
    assert "secret output" not in after.content


def test_a_result_that_cannot_be_shaped_is_an_error_result():
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    @tool
    def odd() -> object:
        """Returns something odd."""
        return Unprintable()

    result = run(Executor([odd]), "odd")
    assert result.is_error and result.decision == "failed"
    assert "RuntimeError: no text for you" in result.content


@tool(timeout=HANG)
async def instant(x: int) -> int:
    """Returns without suspending."""
    return x + 1


@tool(timeout=HANG)
async def suspends(x: int) -> int:
    """Suspends twice, then returns."""
    await asyncio.sleep(0)
    await asyncio.sleep(0.001)
    return x + 2


@tool(timeout=HANG)
async def fails_at_once(x: int) -> int:
    """Raises in its first step."""
    raise KeyError(x)


@tool(timeout=HANG)
async def fails_later(x: int) -> int:
    """Raises after suspending."""
    await asyncio.sleep(0)
    raise KeyError(x)


def _counting_timers(monkeypatch) -> list[str]:
    """Records every asyncio timeout the code under test enters."""
    armed: list[str] = []
    for name in ("timeout", "timeout_at"):
        real = getattr(asyncio, name)

        def counted(when, real=real, name=name):
            armed.append(name)
            return real(when)

        monkeypatch.setattr(asyncio, name, counted)
    return armed


def test_an_async_tool_that_never_suspends_arms_no_timer(monkeypatch):
    armed = _counting_timers(monkeypatch)
    r = run(Executor([instant]), "instant", x=1)
    assert (r.content, r.is_error, armed) == ("2", False, [])


def test_an_async_tool_that_suspends_runs_under_its_timer(monkeypatch):
    armed = _counting_timers(monkeypatch)
    r = run(Executor([suspends]), "suspends", x=1)
    assert (r.content, r.is_error, len(armed)) == ("3", False, 1)


@pytest.mark.parametrize("name", ["fails_at_once", "fails_later"])
def test_an_async_tool_failing_before_or_after_suspending_is_an_error_result(name):
    r = run(Executor([fails_at_once, fails_later]), name, x=7)
    assert r.is_error and r.decision == "failed" and "KeyError: 7" in r.content


def test_a_suspended_async_tool_is_cancelled_through_the_executor():
    state: dict[str, bool] = {}

    @tool(timeout=HANG)
    async def waits(x: int) -> int:
        """Waits until cancelled."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return x

    async def go():
        task = asyncio.ensure_future(Executor([waits]).execute(ToolCall("c", "waits", {"x": 1}), CTX))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert state == {"cancelled": True}


def test_an_awaitable_that_is_not_a_coroutine_keeps_its_timeout():
    async def never(x: int) -> int:
        """Replaced below."""
        return x

    # an async tool whose function hands back a future, not a coroutine: it cannot be stepped, so
    # it is awaited under its timer as before
    t = dataclasses.replace(tool(timeout=0.05)(never), fn=lambda x: asyncio.ensure_future(asyncio.sleep(5)))
    t.is_async = True
    r = run(Executor([t]), "never", x=1)
    assert r.decision == "timeout"


async def test_timed_out_sync_tools_do_not_take_the_next_calls_workers():
    """Issue 24, item 4: after 8 sync tools timed out (their threads still blocked), a trivial sync
    tool still runs (before: 'timed out after 1 s', every worker held by an abandoned call)."""
    import threading

    release = threading.Event()

    @tool(timeout=0.2)
    def stuck(n: int) -> str:
        """Blocks until released."""
        release.wait(HANG)
        return "late"

    @tool(timeout=HANG)
    def quick() -> str:
        """Answers at once."""
        return "quick"

    ex = Executor([stuck, quick], max_workers=8)
    try:
        for n in range(8):
            r = await ex.execute(ToolCall(f"c{n}", "stuck", {"n": n}), CallContext(run_id="r"))
            assert r.decision == "timeout"
        r = await ex.execute(ToolCall("q", "quick", {}), CallContext(run_id="r"))
        assert r.content == "quick" and not r.is_error
    finally:
        release.set()
