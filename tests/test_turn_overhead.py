"""Per-turn work the loop no longer repeats (issue 38 item 5), each decision unchanged: a lone call's
arguments are validated once (the executor announces a turn below the policy's `announce_min_calls`
without its calls), and that empty announcement still ends the last turn's batch answers."""

from __future__ import annotations

import asyncio
from typing import Any

from tether import Agent, Limits
from tether.models._scripted import ScriptedModel, call
from tether.policy import Capabilities, Capability, OracleApprover, SafetyPolicy
from tether.tools import tool
from tether.tools._executor import CallContext, Executor


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return "value-" + key


class Counting:
    """A validator that counts its calls (and validates as the tool's own does)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return self.inner.validate(args)


def test_a_lone_call_is_validated_once_and_two_calls_are_still_announced() -> None:
    counting = Counting(lookup.validator)
    lookup.validator = counting
    try:
        agent = Agent(ScriptedModel([call("lookup", key="a"), "done"]), tools=[lookup], limits=Limits(max_steps=5))
        result = agent.run("look up a")
        assert result.completed and counting.calls == 1
        announced: list[int] = []
        policy = SafetyPolicy()
        real = policy.announce_turn

        async def spy(items: list[Any], ctx: CallContext) -> list[dict[str, Any]]:
            announced.append(len(items))
            return await real(items, ctx)

        policy.announce_turn = spy  # type: ignore[method-assign]
        counting.calls = 0
        agent = Agent(ScriptedModel([[call("lookup", key="a"), call("lookup", key="b")], call("lookup", key="c"), "done"]),
                      tools=[lookup], policy=policy, limits=Limits(max_steps=5))
        assert agent.run("look up a and b").completed
        assert announced == [2, 0] and counting.calls == 2 + 2 + 1  # a turn of two: announced, then run
    finally:
        lookup.validator = counting.inner


def test_an_empty_announcement_still_ends_the_last_turns_batch_answers() -> None:
    pays = [{"recipient": "ACME-1", "amount": 1000.0}, {"recipient": "BOB-2", "amount": 200.0}]

    @tool(effect="irreversible")
    def send_money(recipient: str, amount: float) -> str:
        """Send money."""
        return f"sent {amount} to {recipient}"

    policy = SafetyPolicy(approver=OracleApprover([("send_money", p) for p in pays]),
                          capabilities=Capabilities([Capability("send_money", requires_approval=True)], unlisted="inherit"))
    state = policy.start_run("r", None, ["pay my invoices"], [])
    ctx = CallContext(run_id="r", policy_state=state)
    executor = Executor([send_money], policy=policy)
    decided = asyncio.run(executor.announce([call("send_money", **p) for p in pays], ctx))
    assert [d["approved"] for d in decided] == [True, True] and len(state.decisions) == 2
    assert asyncio.run(executor.announce([call("send_money", **pays[0])], ctx)) == []  # the next turn, one call
    assert state.decisions == {}


def test_each_turns_events_are_the_typed_events_envelopes() -> None:
    """The loop builds the events of every turn straight into their envelopes (`emit_data`): each
    envelope must carry its type's whole payload, field for field and in order, and a telemetry
    observer still gets the typed event."""
    from tether.events import OBSERVERS, BaseEvent, typed

    @tool
    async def fetch(key: str) -> str:
        """Fetch a key."""
        return "got " + key

    seen: list[BaseEvent] = []
    OBSERVERS.append(lambda run_id, event: seen.append(event))
    try:
        agent = Agent(ScriptedModel([call("fetch", key="a"), call("fetch", key="b"), "done"]), tools=[fetch],
                      limits=Limits(max_steps=5, max_tokens=10**9))
        result = agent.run("fetch a then b")
    finally:
        OBSERVERS.pop()
    assert result.completed
    kinds = [e.kind for e in result.trace]
    assert kinds.count("tool_call_started") == kinds.count("tool_call") == 2 and kinds.count("model_call") == 3
    for envelope, event in zip(result.trace, seen, strict=True):
        again = typed(envelope)
        assert list(envelope.data) == list(again.data) and envelope.data == again.data, envelope.kind
        assert type(event) is type(again) and event == again  # what the observer got
        assert (event.step, event.t, event.duration) == (envelope.step, envelope.t, envelope.duration)


def test_a_call_reads_its_tools_declarations_a_few_times_not_once_per_check(monkeypatch: Any) -> None:
    """`Tool.declared` (a property) was read nine times a call, by the policy before and after it and by
    the hidden-values bookkeeping; the policy now reads it once on each side and passes it on."""
    from tether.tools._base import Tool

    reads = 0
    declared = Tool.declared

    def counted(self: Tool) -> Any:
        nonlocal reads
        reads += 1
        return declared.fget(self)  # pyright: ignore[reportOptionalCall]

    monkeypatch.setattr(Tool, "declared", property(counted))

    def reads_in_a_run(calls: int) -> int:
        nonlocal reads
        reads = 0
        script: list[Any] = [call("lookup", key=str(i)) for i in range(calls)]
        agent = Agent(ScriptedModel([*script, "done"]), tools=[lookup], limits=Limits(max_steps=calls + 2))
        result = agent.run("look the keys up")
        assert result.completed and result.output == "done"
        return reads

    per_call = (reads_in_a_run(5) - reads_in_a_run(1)) / 4  # (a run reads some once: its capability, its plan)
    assert per_call <= 4  # the policy before and after the call, binding its arguments, `hides`


def test_a_subclass_is_untrusted_source_hook_still_judges_outputs_after_the_call() -> None:
    """`after_call` reads the declarations once and tests the source itself, but a subclass's own
    `is_untrusted_source` is still the one asked."""
    from tether.tools._base import Tool

    class WebLookups(SafetyPolicy):
        def is_untrusted_source(self, tool: Tool, state: Any = None) -> bool:
            return tool.name == "lookup" or super().is_untrusted_source(tool, state)

    for policy, labelled in ((SafetyPolicy(), False), (WebLookups(), True)):
        agent = Agent(ScriptedModel([call("lookup", key="a"), "done"]), tools=[lookup], policy=policy,
                      limits=Limits(max_steps=4))
        result = agent.run("look a up")
        assert result.completed
        notes = [m for m in result.messages if "data from outside this conversation" in m.content]
        assert bool(notes) is labelled


def test_a_call_carrying_no_hidden_value_skips_the_hidden_values_bookkeeping() -> None:
    """A call with no handle in its arguments, of a tool declaring nothing private, ran all of the
    hidden-values bookkeeping (`bind_data`, `values_of`, `came_back`, `output_label`, `note_shown`, ...;
    16 frames a call) and two executor coroutines; each of those frames returned at once."""
    import sys
    from types import FrameType

    frames: dict[str, int] = {}

    def count(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if event == "call" and ("tether/values/" in name or "tether/tools/_executor" in name):
            key = frame.f_code.co_name
            frames[key] = frames.get(key, 0) + 1

    def frames_in_a_run(calls: int) -> dict[str, int]:
        frames.clear()
        script: list[Any] = [call("lookup", key=str(i)) for i in range(calls)]
        agent = Agent(ScriptedModel([*script, "done"]), tools=[lookup], limits=Limits(max_steps=calls + 2))
        sys.setprofile(count)
        try:
            result = agent.run("look the keys up")
        finally:
            sys.setprofile(None)
        assert result.completed and result.output == "done"
        return dict(frames)

    one, five = frames_in_a_run(1), frames_in_a_run(5)
    per_call = {k: (five.get(k, 0) - one.get(k, 0)) / 4 for k in five.keys() | one.keys()}
    per_call = {k: n for k, n in per_call.items() if n}
    assert "execute" in per_call and "_execute" not in per_call  # one coroutine a call
    skipped = {"bind_data", "values_of", "binding", "quotes_hidden", "came_back", "output_label", "note_shown",
               "declared_readers", "take", "is_conditional"}
    assert not skipped & per_call.keys(), per_call
