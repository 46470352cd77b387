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
               "declared_readers", "take", "is_conditional", "note_sent", "maybe_hide", "hides"}
    assert not skipped & per_call.keys(), per_call


def test_a_short_text_is_counted_once_per_class_string(monkeypatch: Any) -> None:
    """The estimate of a short ASCII text depends only on its characters' classes ("value-12" and
    "value-37" are both letters, a dash, digits): it is counted once per class string, with the same result."""
    from tether._tokens import EstimateCounter

    texts = ["value-12", "value-37", "value-99", '{"key": "12"}', '{"key": "40"}', "done", "an answer, in words."]
    expected = [EstimateCounter()._count_ascii(t) for t in texts]  # pyright: ignore[reportPrivateUsage]
    counter = EstimateCounter()
    counted = 0
    real = EstimateCounter._count_ascii  # pyright: ignore[reportPrivateUsage]

    def counting(self: EstimateCounter, text: str, classes: str | None = None) -> int:
        nonlocal counted
        counted += 1
        return real(self, text, classes)

    monkeypatch.setattr(EstimateCounter, "_count_ascii", counting)
    assert [counter.count(t) for t in texts] == expected
    assert counted == 4  # value-NN, {"key": "NN"}, done, the sentence
    assert [counter.count(t) for t in texts] == expected and counted == 4


def test_an_output_is_indexed_when_its_corpus_is_next_searched() -> None:
    """Adding a tool output to the run's provenance keeps its normalised text; its tokens and numbers are
    indexed when that corpus is next searched (the trusted side is rarely searched), finding the same."""
    from tether.policy._provenance import Corpus, Provenance

    corpus = Corpus()
    corpus.add("Invoice INV-2024 for 1,250.00 USD")
    assert corpus._index == {} and not corpus._nums  # pyright: ignore[reportPrivateUsage]
    assert corpus.has("INV-2024") and corpus.has("1250") and corpus.has_number(1250.0) and not corpus.has("INV-2025")
    assert corpus._index  # pyright: ignore[reportPrivateUsage]
    prov = Provenance()
    prov.add_output("Meet at 14:30 in room B12", trusted=True, source="calendar")
    prov.add_output("wire to GB29 NWBK 6016", trusted=False, source="email")
    again = Provenance.load(prov.dump())
    for value in ("room B12", "GB29NWBK6016", "14:30", "nowhere"):
        assert prov.origin(value) == again.origin(value)
    assert prov.origin("room B12").value == "trusted" and prov.origin("GB29NWBK6016").value == "untrusted"


def test_an_untainted_run_skips_the_checks_that_act_after_taint_only(monkeypatch: Any) -> None:
    """Before the run has read untrusted content, the taint rule cannot act, nor can the egress check and
    the argument scan on a read-only tool with no URL argument: the policy's plan for an untainted run
    leaves them out, and runs them again once it is tainted. With a guard of your own in the list, every
    check runs (it may set what they read)."""
    from tether.policy import default_guards
    from tether.policy._guards import ArgumentScanGuard, EgressGuard, TaintGuard

    ran: dict[str, int] = {}

    def spy(cls: Any) -> None:
        real = cls.check

        def check(self: Any, c: Any, /) -> Any:
            ran[cls.__name__] = ran.get(cls.__name__, 0) + 1
            return real(self, c)

        monkeypatch.setattr(cls, "check", check)

    for cls in (TaintGuard, EgressGuard, ArgumentScanGuard):
        spy(cls)

    @tool(effect="read_only")
    async def fetch(key: str) -> str:
        """Fetch a key."""
        return "got " + key

    @tool(untrusted_output=True, effect="read_only", hide_output=False)
    async def browse(key: str) -> str:
        """Read a page."""
        return "page " + key

    def run(policy: SafetyPolicy, calls: list[Any]) -> None:
        agent = Agent(ScriptedModel([*calls, "done"]), tools=[fetch, browse], policy=policy,
                      limits=Limits(max_steps=len(calls) + 2))
        assert agent.run("fetch").completed

    run(SafetyPolicy(), [call("fetch", key="a"), call("fetch", key="b")])
    assert ran == {}
    run(SafetyPolicy(), [call("browse", key="a"), call("fetch", key="b")])
    assert ran == {"TaintGuard": 1, "EgressGuard": 1, "ArgumentScanGuard": 1}  # fetch, after taint

    class Mine:
        def check(self, c: Any, /) -> None:
            return None

    ran.clear()
    run(SafetyPolicy(guards=[*default_guards(), Mine()]), [call("fetch", key="a")])
    assert ran == {"TaintGuard": 1, "EgressGuard": 1, "ArgumentScanGuard": 1}


def test_a_policys_optional_hooks_are_looked_up_once_not_every_turn() -> None:
    """The executor looked the policy's optional hooks (`announce_turn`, `announce_min_calls`) up by name
    on every turn; it now does once per policy, and again when the executor's policy is replaced."""
    from tether.tools._executor import BasePolicy

    looked: list[str] = []

    class Announcing(BasePolicy):
        def __getattribute__(self, name: str) -> Any:
            if name in ("announce_turn", "announce_min_calls"):
                looked.append(name)
            return super().__getattribute__(name)

        async def announce_turn(self, items: list[Any], ctx: CallContext) -> list[dict[str, Any]]:
            return []

    policy = Announcing()
    agent = Agent(ScriptedModel([call("lookup", key=str(i)) for i in range(4)] + ["done"]), tools=[lookup],
                  policy=policy, limits=Limits(max_steps=6))
    assert agent.run("look them up").completed
    assert sorted(looked) == ["announce_min_calls", "announce_turn"]
    assert agent.executor is not None
    agent.executor.policy = Announcing()
    agent.model = ScriptedModel([call("lookup", key=str(i)) for i in range(4)] + ["done"])
    looked.clear()
    assert agent.run("look them up").completed and sorted(looked) == ["announce_min_calls", "announce_turn"]


def test_planning_and_observing_a_turn_make_no_coroutine() -> None:
    """`run_loop` calls the two steps that never await (planning the calls, observing their results)
    as plain functions; `agent.iter()` still steps through the same nodes."""
    import sys
    from types import FrameType

    names: list[str] = []

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.replace("\\", "/").endswith("tether/_loop.py"):
            names.append(frame.f_code.co_name)

    agent = Agent(ScriptedModel([call("lookup", key="a"), "done"]), tools=[lookup], limits=Limits(max_steps=4))
    sys.setprofile(count)
    try:
        result = agent.run("look a up")
    finally:
        sys.setprofile(None)
    assert result.completed
    assert "plan_calls" not in names and "observe" not in names and names.count("planned") == 2

    agent = Agent(ScriptedModel([call("lookup", key="a"), "done"]), tools=[lookup], limits=Limits(max_steps=4))

    async def stepped() -> list[str]:
        kinds = []
        async with agent.iter("look a up") as run:
            async for node in run:
                kinds.append(type(node).__name__)
        return kinds

    import asyncio as _asyncio

    assert _asyncio.run(stepped()) == ["Start", "Admit", "CallModel", "PlanCalls", "Execute", "Observe", "Admit",
                                       "CallModel", "PlanCalls", "StopRun", "End"]


def _frames_per_call(agent_for: Any, files: tuple[str, ...]) -> dict[str, float]:
    """Frames (function name -> count) a call adds in `files`: a 5-call run's less a 1-call run's, over 4."""
    import sys
    from collections import Counter
    from types import FrameType

    def frames(calls: int) -> Counter[str]:
        names: Counter[str] = Counter()

        def count(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code.co_filename.replace("\\", "/").endswith(files):
                names[frame.f_code.co_name] += 1

        agent = agent_for(calls)
        sys.setprofile(count)
        try:
            result = agent.run("look the keys up")
        finally:
            sys.setprofile(None)
        assert result.completed and result.output == "done"
        return names

    one, five = frames(1), frames(5)
    return {name: (five[name] - one[name]) / 4 for name in five | one}


def _priced_agent(calls: int) -> Agent:
    from tether.models import Pricing

    model = ScriptedModel([*[call("lookup", key=str(i)) for i in range(calls)], "done"])
    return Agent(model, tools=[lookup], pricing=Pricing().with_prices({model.name: (3.0, 15.0)}),
                 limits=Limits(max_steps=calls + 2, max_tokens=10**6, max_cost_usd=100.0))


def test_a_reply_is_priced_and_admitted_without_helper_frames() -> None:
    """Pricing a reply called `lookup`, `declared_price` and `usage_cost` besides `charge`; admitting a
    step called `Admission.admit` between the loop and `Budget.admit`. Now: one frame each, the same
    charge (`usage_cost` still prices cached tokens) and the same output cap."""
    per_call = _frames_per_call(_priced_agent, ("tether/models/_pricing.py", "tether/_admission.py"))
    assert per_call.get("charge") == 1
    assert per_call.get("lookup", 0) == per_call.get("declared_price", 0) == per_call.get("usage_cost", 0) == 0
    assert per_call.get("admit", 0) == 0 and per_call.get("count") == 1


def test_a_reply_costs_what_usage_cost_says() -> None:
    from tether._types import ModelReply, Usage
    from tether.models import Pricing
    from tether.models._pricing import charge

    model = ScriptedModel(["done"])
    pricing = Pricing().with_prices({model.name: (3.0, 15.0)})
    for usage in (Usage(1200, 80), Usage(0, 0), Usage(1000, 50, cached_input_tokens=600),
                  Usage(1000, 50, cache_write_tokens=300)):
        reply = ModelReply(text="done", usage=usage)
        assert charge(pricing, model, reply) == pricing.usage_cost(model.name, usage, (3.0, 15.0))
    declared = ScriptedModel(["done"])
    declared.price = (1.0, 2.0)  # pyright: ignore[reportAttributeAccessIssue]
    assert charge(Pricing(), declared, ModelReply(text="x", usage=Usage(10**6, 10**6))) == 3.0


def test_a_plain_tools_call_reads_no_declarations_property_and_no_hooks_frame() -> None:
    """A tool without metadata has no deprecated keys to apply: the policy and the executor read its
    `declares` as they are (no `Tool.declared` frame), and the executor's hooks with no `hooks()` frame."""
    def agent_for(calls: int) -> Agent:
        return Agent(ScriptedModel([*[call("lookup", key=str(i)) for i in range(calls)], "done"]), tools=[lookup],
                     limits=Limits(max_steps=calls + 2))

    per_call = _frames_per_call(agent_for, ("tether/tools/_base.py", "tether/tools/_executor.py"))
    assert per_call.get("hooks", 0) == 0
    assert per_call.get("declared", 0) <= 1  # the hidden-values binding's (tether.values)


def test_a_lone_calls_turn_forgets_no_batches_and_findings_resume_no_generator() -> None:
    """A lone call's turn announced empty called `forget_batches` with no batch to forget; the run's
    findings were gathered by a generator resumed once per call. Neither frame now (the last turn's batch
    answers are still forgotten: test_an_empty_announcement_still_ends_the_last_turns_batch_answers)."""
    def agent_for(calls: int) -> Agent:
        return Agent(ScriptedModel([*[call("lookup", key=str(i)) for i in range(calls)], "done"]), tools=[lookup],
                     limits=Limits(max_steps=calls + 2))

    per_call = _frames_per_call(agent_for, ("tether/policy/_batch.py", "tether/_loop.py"))
    assert per_call.get("forget_batches", 0) == 0
    assert per_call.get("<genexpr>", 0) == 0 and per_call.get("_finding") == 1
