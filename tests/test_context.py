"""Context: token accounting, compaction (pairing, threshold, summary, prefix), task state, cached pricing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import Agent, Limits, tool
from tether._limits import Budget, MonotonicClock
from tether._loop import ContextRun, DirectStepRunner, RunSpec
from tether._tokens import message_tokens, size_bound, tiktoken_encoding
from tether._types import Message, ModelReply, ModelRequest, RunResult, ToolCall, Usage, from_json, to_json
from tether.context import (
    Compaction,
    ContextOverflow,
    EstimateCounter,
    MessageSizes,
    PlanStep,
    TaskState,
    context_window,
    counter_for,
    cut_result,
)
from tether.models._anthropic import AnthropicModel
from tether.models._openai_compat import to_openai_messages, to_openai_tools
from tether.models._pricing import Pricing
from tether.models._scripted import ScriptedModel, call
from tether.tools._executor import Executor

# ----- token accounting ----------------------------------------------------------------------------

needs_tiktoken = pytest.mark.skipif(tiktoken_encoding("o200k_base") is None, reason="tiktoken/bpe-openai absent")


@needs_tiktoken
def test_openai_models_use_their_own_tokenizer_offline() -> None:
    counter = counter_for("gpt-4o-2024-08-06")
    assert counter.name == "tiktoken/o200k_base"
    assert counter.count("hello world") == 2
    assert counter_for("openai/gpt-4-turbo").name == "tiktoken/cl100k_base"


@needs_tiktoken
def test_estimate_is_calibrated_against_the_tokenizer() -> None:
    exact, estimate = counter_for("gpt-4o"), EstimateCounter()
    samples = [
        "The committee reviewed the proposal and decided to postpone the vote until further data arrive. " * 20,
        "\n".join(f"2026-11-30T03:{i:02d}:11Z INFO api-3 request_id=req-{10**7 + i * 7919} status=200 "
                  f"latency_ms={i * 13}" for i in range(60)),
        json.dumps([{"id": i, "name": f"user{i}", "active": i % 2 == 0} for i in range(80)]),
    ]
    for text in samples:
        assert abs(estimate.count(text) - exact.count(text)) / exact.count(text) < 0.2


def test_unknown_vendors_get_the_estimate_and_a_window_from_the_table() -> None:
    assert counter_for("claude-sonnet-4-5").name == "estimate"
    assert context_window("anthropic/claude-sonnet-4-5") == 200_000
    assert context_window("gpt-4o-mini-2024-07-18") == 128_000
    assert context_window("my-model", {"my-model": 4096}) == 4096
    assert context_window("never-heard-of") == 32_768


class CountingCounter:
    name = "counting"

    def __init__(self) -> None:
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return len(text.split())


def test_each_message_is_counted_once_incrementally() -> None:
    counter = CountingCounter()
    sizes = MessageSizes(counter)
    messages = [Message.system("be brief"), Message.user("one two three")]
    sizes.sync(messages)
    first = sizes.total()
    messages.append(Message.assistant("four five"))
    sizes.sync(messages)
    assert sizes.total() == first + message_tokens(EstimateCounter(), Message.assistant("x")) - 1 + 2
    assert sizes.total(2) == 4 + 2
    counted = len(counter.texts)
    sizes.sync(messages)
    sizes.total()
    assert len(counter.texts) == counted  # nothing re-counted
    for m in messages:
        assert sizes.bound(messages.index(m), messages.index(m) + 1) >= message_tokens(counter_for("gpt-4o"), m)


@given(st.text(max_size=300))
def test_size_bound_is_an_upper_bound(text: str) -> None:
    m = Message("tool", text, name="t")
    assert size_bound(m) >= message_tokens(EstimateCounter(), m)
    if tiktoken_encoding("o200k_base") is not None:
        assert size_bound(m) >= message_tokens(counter_for("gpt-4o"), m)


def test_limits_validate_the_input_bound() -> None:
    with pytest.raises(ValueError, match="max_input_tokens"):
        Limits(max_input_tokens=-1)


def test_cached_tokens_are_priced_at_the_cache_rate() -> None:
    pricing = Pricing()
    fresh = pricing.usage_cost("claude-sonnet-4-5", Usage(input_tokens=1_000_000))
    cached = pricing.usage_cost("claude-sonnet-4-5", Usage(input_tokens=1_000_000, cached_input_tokens=900_000))
    assert fresh == pytest.approx(3.0)
    assert cached == pytest.approx(0.1 * 3.0 + 0.9 * 0.3)
    written = pricing.usage_cost("claude-sonnet-4-5", Usage(input_tokens=1_000_000, cache_write_tokens=1_000_000))
    assert written == pytest.approx(3.75)
    from types import SimpleNamespace

    from tether.models._openai_compat import _usage

    parsed = _usage(SimpleNamespace(prompt_tokens=120, completion_tokens=7,
                                    prompt_tokens_details=SimpleNamespace(cached_tokens=100)))
    assert (parsed.input_tokens, parsed.cached_input_tokens, parsed.output_tokens) == (120, 100, 7)
    assert _usage(SimpleNamespace(prompt_tokens=3, completion_tokens=1)).cached_input_tokens == 0
    total = Usage(input_tokens=5, cached_input_tokens=3)
    total.add(Usage(input_tokens=5, cached_input_tokens=2, cache_write_tokens=1))
    assert (total.cached_input_tokens, total.cache_write_tokens) == (5, 1)


# ----- a compactor driven directly -----------------------------------------------------------------


def summary_model(text: str = "summary") -> ScriptedModel:
    return ScriptedModel(lambda request: text, name="cheap")


def compactor(window: int = 2000, model: ScriptedModel | None = None, limits: Limits | None = None, **kw: Any):
    config = Compaction(window=window, summary_model=model or summary_model(), counter=EstimateCounter(), **kw)
    spec = RunSpec(model=ScriptedModel([], name="main"), executor=Executor([]), limits=limits or Limits())
    events: list[Any] = []
    run = ContextRun(spec, Budget(spec.limits, MonotonicClock()),
                     lambda event, since=None: events.append(event.data) if event.kind == "model_call" else None)
    return config.start(run), events


def turn(i: int, results: list[int], user: bool = False) -> list[Message]:
    calls = [ToolCall(f"c{i}_{j}", "search", {"q": f"{i}-{j}"}) for j in range(len(results))]
    out = [Message.assistant(f"step {i}", calls)]
    out += [Message("tool", "\n".join(f"line {k} of result {i}.{j}" for k in range(n)), tool_call_id=c.id,
                    name="search") for j, (c, n) in enumerate(zip(calls, results, strict=True))]
    if user:
        out.append(Message.user(f"keep going {i}"))
    return out


def check_pairing(out: list[Message]) -> None:
    """Each call answered exactly once, after it; each result has its call earlier."""
    open_calls: set[str] = set()
    answered: set[str] = set()
    for m in out:
        if m.role == "assistant":
            assert not open_calls, f"calls {open_calls} unanswered before the next assistant message"
            open_calls = {c.id for c in m.tool_calls}
        elif m.role == "tool":
            assert m.tool_call_id in open_calls, f"result {m.tool_call_id} without its call"
            open_calls.discard(m.tool_call_id)
            assert m.tool_call_id not in answered
            answered.add(m.tool_call_id)
    assert not open_calls


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), max_size=3), st.booleans()), min_size=1, max_size=14),
       st.integers(600, 3000), st.integers(1, 3))
async def test_pairing_invariant_under_compaction(turns: list[tuple[list[int], bool]], window: int,
                                                  keep: int) -> None:
    comp, _ = compactor(window=window, keep_turns=keep)
    messages = [Message.system("You are careful."), Message.user("investigate")]
    for i, (results, user) in enumerate(turns):
        messages.extend(turn(i, results, user))
        try:
            out = await comp.build(messages)
        except ContextOverflow:
            continue  # the kept turns alone exceed the window: refused with a clear error, not cut
        check_pairing(out)
        assert out[0] is messages[0] and out[1] is messages[1]  # the prefix: the same objects
        starts = [k for k, m in enumerate(messages) if m.role == "assistant"]
        for k in starts[-keep:]:
            assert messages[k] in out  # the last turns verbatim
            assert all(x in out for x in messages[k:])


async def test_under_the_threshold_the_transcript_is_sent_as_is() -> None:
    model = summary_model()
    comp, _ = compactor(window=100_000, model=model)
    messages = [Message.system("s"), Message.user("go"), *turn(0, [30]), *turn(1, [30])]
    assert await comp.build(messages) is messages
    assert model.calls == 0


async def test_passing_the_threshold_folds_completed_turns() -> None:
    model = summary_model("- searched 0 and 1")
    comp, events = compactor(window=1000, model=model)
    messages = [Message.system("s"), Message.user("go")]
    built = []
    for i in range(6):
        messages.extend(turn(i, [40]))
        built.append(await comp.build(messages))
    assert model.calls >= 1 and comp.compactions == model.calls
    assert events and all(e["purpose"] == "compaction" for e in events)
    last = built[-1]
    assert last[2].role == "user" and last[2].content.startswith("[Context compacted")
    assert "- searched 0 and 1" in last[2].content
    assert [m.role for m in last[3:]] == ["assistant", "tool", "assistant", "tool"]
    assert last[3] is messages[-4] and last[-1] is messages[-1]
    assert comp.last_input_tokens <= 1000


async def test_summary_prompt_asks_for_the_facts_and_the_extractor_keeps_them() -> None:
    model = summary_model("the model forgot everything")
    comp, _ = compactor(window=900, model=model)
    clue = "2026-11-30T03:01:47Z ERROR alert ALRT-20931 fired on host db-07, p99 8.2s"
    messages = [Message.system("s"), Message.user("go"),
                Message.assistant("Hypothesis: the pool on db-07 is exhausted.", [ToolCall("a", "search", {})]),
                Message("tool", "\n".join([*(f"INFO ok {k}" for k in range(60)), clue]), tool_call_id="a",
                        name="search"),
                *turn(1, [40]), *turn(2, [40])]
    out = await comp.build(messages)
    request = model.requests[0]
    system, prompt = request.messages[0].content, request.messages[1].content
    for word in ("name", "id", "number", "timestamp", "hypothesis"):
        assert word in system
    assert clue in prompt and "Hypothesis: the pool on db-07" in prompt  # the summarizer saw them
    assert "INFO ok 59" not in prompt  # old results reach it cut
    summary = out[2].content
    assert "the model forgot everything" in summary
    assert clue in summary  # kept by the extractor, not by the model
    assert "Hypothesis: the pool on db-07 is exhausted." in summary


async def test_a_failed_summary_call_keeps_the_run_going() -> None:
    def broken(request: ModelRequest) -> ModelReply:
        raise RuntimeError("provider down")

    comp, _ = compactor(window=800, model=ScriptedModel(broken))
    messages = [Message.system("s"), Message.user("go"), *turn(0, [40]), *turn(1, [40]), *turn(2, [40])]
    out = await comp.build(messages)
    assert comp.summary_failures == 1
    assert 'search({"q": "0-0"})' in out[2].content  # what was done survives without the model


async def test_the_input_bound_refuses_what_cannot_fit() -> None:
    comp, _ = compactor(window=100_000, limits=Limits(max_input_tokens=300))
    messages = [Message.system("s"), Message.user("go"), *turn(0, [200]), *turn(1, [200])]
    with pytest.raises(ContextOverflow, match="max_input_tokens"):
        await comp.build(messages)


def test_cut_result_keeps_first_lines_telling_lines_and_handle() -> None:
    text = "\n".join([*(f"INFO line {i}" for i in range(50)), "ERROR disk full on db-07",
                      '[truncated: showing characters 0-4000 of 9000. For more call read_result(handle="r3", '
                      'offset=4000, length=4000).]'])
    cut = cut_result(text, lines=2)
    assert cut.startswith("INFO line 0\nINFO line 1\n")
    assert "ERROR disk full on db-07" in cut and 'read_result(handle="r3"' in cut and "INFO line 30" not in cut


# ----- through the loop ----------------------------------------------------------------------------


@tool(max_result_chars=50_000)
def search_logs(q: str) -> str:
    """Search the logs."""
    return "\n".join(f"2026-11-30T03:{i:02d}:00Z INFO svc request ok latency_ms={i * 7}" for i in range(60)) + (
        f"\n2026-11-30T03:59:59Z ERROR pool exhausted on host db-{q}")


class RecordingRunner(DirectStepRunner):
    """A step runner that records every model step (as a durable runner checkpoints them)."""

    def __init__(self) -> None:
        self.model_steps: list[int] = []

    async def model_step(self, step, run):
        self.model_steps.append(step)
        return await run()


def test_compaction_call_is_a_recorded_step_and_the_prefix_stays_byte_identical() -> None:
    main = ScriptedModel([call("search_logs", q=str(i)) for i in range(8)] + ["done"], name="main")
    cheap = summary_model("- searched")
    compaction = Compaction(window=6000, summary_model=cheap)
    runner = RecordingRunner()
    agent = Agent(main, tools=[search_logs, *compaction.tools()], instructions="You investigate.",
                  context=compaction, step_runner=runner, limits=Limits(max_steps=40))
    result = agent.run("find the failing host")
    assert result.completed, result.error
    assert cheap.calls >= 2
    assert len(runner.model_steps) == main.calls + cheap.calls  # every call went through the runner
    assert runner.model_steps == sorted(set(runner.model_steps))  # one distinct step each
    compactions = [e for e in result.trace if e.kind == "model_call" and e.data.get("purpose") == "compaction"]
    assert len(compactions) == cheap.calls
    # the static prefix: system prompt and tool definitions, byte-identical in every request
    anthropic = AnthropicModel.__new__(AnthropicModel)
    anthropic.model, anthropic.max_tokens, anthropic.temperature, anthropic.cache_prompt = "claude-x", 100, None, True
    prefixes = set()
    for request in main.requests:
        params = anthropic._params(request)
        prefixes.add(json.dumps([params["system"], params["tools"]], sort_keys=True)
                     + json.dumps([to_openai_messages(request.messages)[:2], to_openai_tools(request.tools)]))
        assert params["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert params["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert len(prefixes) == 1
    assert max(len(r.messages) for r in main.requests[-3:]) < len(main.requests[-1].messages) + 1
    assert len(main.requests[-1].messages) < len(result.messages)  # really compacted
    assert "db-0" in main.requests[-1].messages[2].content  # the early fact is still sent


def test_input_bound_stops_the_run_with_one_clear_error() -> None:
    main = ScriptedModel([call("search_logs", q="1"), call("search_logs", q="2"), "done"], name="main")
    agent = Agent(main, tools=[search_logs], context=Compaction(summary_model=summary_model()),
                  limits=Limits(max_input_tokens=500))
    result = agent.run("go")
    assert result.stop_reason.value == "error" and "max_input_tokens" in (result.error or "")


# ----- task state ----------------------------------------------------------------------------------


def test_task_state_round_trips_and_renders_compactly() -> None:
    state = TaskState(goal="find the root cause")
    state.set_plan([PlanStep("s1", "search gateway"), PlanStep("s2", "search db", ["s1"])])
    state.update("s1", "running")
    state.update("s1", "done", "503s start 03:00:12Z")
    state.record("failing host", "db-07")
    assert [s.id for s in state.ready()] == ["s2"]
    again = TaskState.from_json(state.to_json())
    assert again == state and TaskState.from_dict(state.to_dict()) == state
    text = state.render()
    assert "- [x] s1: search gateway -> 503s start 03:00:12Z" in text
    assert "- [ ] s2: search db (after s1)" in text and "- failing host: db-07" in text


def test_plan_validation_and_replanning_keeps_done_steps() -> None:
    state = TaskState()
    with pytest.raises(ValueError, match="cycle"):
        state.set_plan([PlanStep("a", "x", ["b"]), PlanStep("b", "y", ["a"])])
    with pytest.raises(ValueError, match="unknown"):
        state.set_plan([PlanStep("a", "x", ["z"])])
    state.set_plan([PlanStep("a", "x"), PlanStep("b", "y", ["a"])])
    state.update("a", "done", "found 3")
    state.update("b", "failed", "timeout")
    state.set_plan([PlanStep("a", "x"), PlanStep("c", "other way", ["a"])])
    assert state.step("a").status == "done" and state.step("a").result == "found 3"
    assert [s.id for s in state.ready()] == ["c"]
    with pytest.raises(KeyError):
        state.step("b")


def test_the_model_keeps_its_plan_and_facts_with_tools_and_gets_them_back() -> None:
    compaction = Compaction(summary_model=summary_model())
    script = [
        call("update_plan", steps=[{"id": "s1", "title": "search"}, {"id": "s2", "title": "report",
                                                                        "depends_on": ["s1"]}], goal="root cause"),
        [call("set_step", step_id="s1", status="running"), call("search_logs", q="7")],
        [call("record_fact", key="failing host", value="db-7"), call("set_step", step_id="s1", status="done",
                                                                       result="db-7 pool exhausted")],
        call("set_step", step_id="nope", status="done"),
        "db-7",
    ]
    main = ScriptedModel(script, name="main")
    agent = Agent(main, tools=[search_logs, *compaction.tools()], context=compaction)
    result = agent.run("why?")
    assert result.completed
    state = TaskState.from_dict(result.task_state or {})
    assert state.goal == "root cause" and state.facts == {"failing host": "db-7"}
    assert state.step("s1").status == "done" and state.step("s1").attempts == 1
    shown = main.requests[-1].messages[-1].content
    assert shown.startswith("# Task state") and "failing host: db-7" in shown
    assert "no plan step 'nope'" in main.requests[-1].messages[-2].content  # a bad update is text, not a crash
    again = from_json(RunResult, to_json(result))
    assert again.task_state == result.task_state


async def test_per_call_work_does_not_grow_with_the_transcript() -> None:
    counter = CountingCounter()
    config = Compaction(window=1500, summary_model=ScriptedModel(broken_summary), counter=counter, summary_words=60)
    spec = RunSpec(model=ScriptedModel([], name="main"), executor=Executor([]))
    comp = config.start(ContextRun(spec, Budget(spec.limits, MonotonicClock()), lambda *a, **k: None))
    messages = [Message.system("s"), Message.user("go")]
    for i in range(120):
        messages.extend(turn(i, [20]))
        out = await comp.build(messages)
        assert len(out) <= 2 + 1 + 2 * 8  # bounded: the window holds a few turns, never the history
    message_texts = sum(1 + len(m.tool_calls) * 2 + (1 if m.name else 0) for m in messages)
    assert comp.compactions > 20 and comp.summary_failures == comp.compactions
    # every message tokenized once; the rest is the summary message, once per compaction
    assert len(counter.texts) <= message_texts + 3 * comp.compactions
    assert len(out[2].content.split("Facts kept")[0].split()) <= 60 + 30  # the fallback summary stays bounded


def broken_summary(request: ModelRequest) -> ModelReply:
    raise RuntimeError("no summaries today")


async def test_a_continued_conversations_prompt_survives_folding() -> None:
    comp, _ = compactor(window=900)
    history = [Message.system("s"), Message.user("first task"), *turn(0, [40]), *turn(1, [40]),
               Message.assistant("earlier answer")]
    prompt = Message.user("NEW TASK: check db-07 again")
    messages = [*history, prompt]
    await comp.build(messages)  # the run's first call: the prompt is the last message
    for i in range(2, 7):
        messages.extend(turn(i, [40]))
        out = await comp.build(messages)
        check_pairing(out)
    assert comp.compactions and prompt in out and out.index(prompt) == 3


def test_a_builder_that_fails_to_start_ends_the_run_with_one_error() -> None:
    class Broken:
        def build(self, messages):
            return messages

        def start(self, run):
            raise RuntimeError("no context today")

    result = Agent(ScriptedModel(["hi"]), context=Broken()).run("go")
    assert result.stop_reason.value == "error" and "no context today" in (result.error or "")


def test_unusable_ranks_fall_back_to_the_estimate(monkeypatch) -> None:
    import tether._tokens as tokens

    monkeypatch.setattr(tokens, "tiktoken_encoding", lambda name: None)  # e.g. a hash mismatch
    counter = tokens.TiktokenCounter("o200k_base")
    assert counter.count("hello world") == EstimateCounter().count("hello world")
    assert counter.name == "estimate"
