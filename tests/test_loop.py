"""The loop through every stop reason, driven by scripted models."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hang import HANG

from tether import Agent, BasePolicy, CancelToken, Limits, StopReason, tool
from tether._types import ModelReply, ModelRequest, RunResult, Usage, from_json, to_json
from tether.models._pricing import Pricing
from tether.models._scripted import RecordingModel, ReplayModel, ScriptedModel, call, reply
from tether.tools._executor import CallContext, Verdict


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def endless(req: ModelRequest):
    """A model that never stops calling tools (distinct arguments each time)."""
    if req.tool_choice == "none":
        return "partial: I found some values"
    return call("lookup", key=f"k{len(req.messages)}")


def test_completed_with_tool_call_and_answer():
    model = ScriptedModel([call("add", a=2, b=3), "2 + 3 = 5"])
    result = Agent(model, tools=[add], instructions="Be brief.").run("What is 2+3?")
    assert result.stop_reason is StopReason.COMPLETED
    assert result.answer == "2 + 3 = 5"
    assert result.usage.model_calls == 2 and result.usage.tool_calls == 1
    assert [m.role for m in result.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert result.messages[3].content == "5"
    assert result.findings == ['add({"a": 2, "b": 3}) -> 5']
    kinds = [e.kind for e in result.trace]
    assert kinds == ["run_started", "model_call_started", "model_call", "tool_call_started", "tool_call",
                     "model_call_started", "model_call", "stop"]
    tool_event = result.trace[4]
    assert tool_event.data["name"] == "add" and tool_event.data["decision"] == "allowed"
    assert tool_event.data["arguments"] == {"a": 2, "b": 3}


def test_max_steps_ends_with_tool_free_partial_answer_and_skips_unread_tools():
    ran: list[str] = []

    @tool
    def record(key: str) -> str:
        """Record a key."""
        ran.append(key)
        return "ok"

    def script(req: ModelRequest):
        if req.tool_choice == "none":
            return "best partial answer"
        return call("record", key=f"k{len(req.messages)}")

    model = ScriptedModel(script)
    result = Agent(model, tools=[record], limits=Limits(max_steps=3)).run("go")
    assert result.stop_reason is StopReason.MAX_STEPS
    assert result.answer == "best partial answer"
    assert result.steps == 3
    # The third reply's call would have been read by no model call: it never ran.
    assert len(ran) == 2
    assert model.requests[-1].tool_choice == "none"  # the final call may call no tool
    assert result.usage.model_calls == 4
    skipped = [m for m in result.messages if m.role == "tool" and "not run" in m.content]
    assert len(skipped) == 1
    assert len(result.findings) == 2


def test_endless_model_is_bounded_and_final_answer_can_be_switched_off():
    model = ScriptedModel(endless)
    result = Agent(model, tools=[lookup], limits=Limits(max_steps=5, final_answer=False)).run("go")
    assert result.stop_reason is StopReason.MAX_STEPS
    assert model.calls == 5
    assert all(r.tools and r.tool_choice is None for r in model.requests)


def test_token_budget_counts_tokens_and_keeps_a_reserve():
    model = ScriptedModel(endless, usage=Usage(input_tokens=100, output_tokens=20))
    result = Agent(model, tools=[lookup], limits=Limits(max_steps=None, max_tokens=1000)).run("go")
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    # a ceiling: each step is sized before it is sent (the model's reported 100 input tokens raise the
    # run's estimate), steps stop short of the 10% reserve, and the final call fits what is left
    assert result.usage.total_tokens <= 1000
    assert result.usage.model_calls >= 4
    assert result.answer.startswith("partial")
    assert model.requests[-1].tool_choice == "none"
    assert all(r.max_output_tokens is not None for r in model.requests)


def test_cost_budget_uses_the_price_table():
    pricing = Pricing({"scripted": (10_000.0, 0.0)})  # $0.01 per input token
    model = ScriptedModel(endless, usage=Usage(input_tokens=1, output_tokens=0))
    result = Agent(model, tools=[lookup], pricing=pricing, limits=Limits(max_steps=50, max_cost_usd=5)).run("go")
    assert result.stop_reason is StopReason.COST_BUDGET
    first = next(e for e in result.trace if e.kind == "model_call")
    assert first.data["cost_usd"] == pytest.approx(0.01)  # the table's price, not the model's $0
    # each call is priced before it is sent (its input as counted, at $0.01 a token): never over $5
    assert 0.01 <= result.usage.cost_usd <= 5


def test_a_step_the_cost_ceiling_cannot_afford_is_not_sent():
    pricing = Pricing({"scripted": (1_000_000.0, 0.0)})  # $1 per input token: "go" alone costs more than $5
    model = ScriptedModel(endless, usage=Usage(input_tokens=1, output_tokens=0))
    result = Agent(model, tools=[lookup], pricing=pricing, limits=Limits(max_steps=50, max_cost_usd=5)).run("go")
    assert result.stop_reason is StopReason.COST_BUDGET
    assert model.calls == 0 and result.usage.cost_usd == 0
    assert "limit" in result.answer


def test_time_budget_with_an_injected_clock():
    clock = FakeClock()

    @tool
    def slow(key: str) -> str:
        """Takes 10 simulated seconds."""
        clock.t += 10
        return "done"

    def script(req: ModelRequest):
        return call("slow", key=str(len(req.messages))) if req.tool_choice != "none" else "partial"

    result = Agent(ScriptedModel(script), tools=[slow], clock=clock,
                   limits=Limits(max_seconds=45, max_steps=None)).run("go")
    assert result.stop_reason is StopReason.TIME_BUDGET
    assert result.usage.tool_calls == 5  # 50 s >= 40.5 s (45 minus the reserve)
    assert result.usage.seconds == pytest.approx(50)
    assert result.answer == "partial"


def test_tool_call_budget_refuses_extra_calls_in_a_turn():
    model = ScriptedModel([[call("add", a=1, b=1), call("add", a=2, b=2), call("add", a=3, b=3)], "partial"])
    result = Agent(model, tools=[add], limits=Limits(max_tool_calls=2)).run("go")
    assert result.stop_reason is StopReason.TOOL_CALL_BUDGET
    assert result.usage.tool_calls == 2
    refused = [m.content for m in result.messages if m.role == "tool" and "budget" in m.content]
    assert len(refused) == 1


def test_loop_detection_warns_then_stops():
    model = ScriptedModel(lambda req: call("add", b=2, a=1) if req.tool_choice != "none" else "I kept getting 3")
    result = Agent(model, tools=[add], limits=Limits(max_repeats=2)).run("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert result.usage.tool_calls == 2  # two real runs, then a notice instead of a third, then stop
    notices = [m.content for m in result.messages if m.role == "tool" and m.content.startswith("NOTICE")]
    assert len(notices) == 1 and "exactly these arguments 2 times" in notices[0]
    assert result.answer == "I kept getting 3"


def test_loop_detection_uses_canonical_arguments():
    from tether._limits import LoopDetector

    d = LoopDetector(1)
    assert d.check("t", {"a": 1, "b": [1, 2]}) == "run"
    assert d.check("t", {"b": [1, 2], "a": 1}) == "warn"
    assert d.check("t", {"a": 2, "b": [1, 2]}) == "run"
    assert d.check("u", {"a": 1, "b": [1, 2]}) == "run"
    assert d.check("t", {"a": 1, "b": [1, 2]}) == "stop"
    assert LoopDetector(None).check("t", {}) == "run"


def test_model_error_stops_with_error_and_keeps_the_trace():
    model = ScriptedModel([call("add", a=1, b=2)])  # runs out: raises ModelError on the 2nd call
    result = Agent(model, tools=[add]).run("go")
    assert result.stop_reason is StopReason.ERROR
    assert "ran out of replies" in (result.error or "")
    assert result.findings == ['add({"a": 1, "b": 2}) -> 3']


async def test_cancellation_during_a_tool_call():
    token = CancelToken()
    started = asyncio.Event()

    @tool
    async def wait_forever(x: int) -> str:
        """Never returns."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    agent = Agent(ScriptedModel([call("wait_forever", x=1)]), tools=[wait_forever])
    task = asyncio.create_task(agent.arun("go", cancel=token))
    await started.wait()
    task.cancel()
    result = await task
    assert result.stop_reason is StopReason.CANCELLED
    assert result.messages[-1].role == "tool" and "cancelled" in result.messages[-1].content


async def test_cancel_token_interrupts_a_model_call():
    token = CancelToken()

    class SlowModel:
        name = "slow"

        async def complete(self, request):
            await asyncio.sleep(3600)

        def stream(self, request):  # pragma: no cover - not used
            raise NotImplementedError

    agent = Agent(SlowModel())
    task = asyncio.create_task(agent.arun("go", cancel=token))
    await asyncio.sleep(0.01)
    token.cancel("user pressed stop")
    result = await task
    assert result.stop_reason is StopReason.CANCELLED
    assert result.error == "user pressed stop"


def test_awaiting_approval_stops_the_run():
    class NeedsApproval(BasePolicy):
        async def before_call(self, tool, args, call, ctx: CallContext) -> Verdict:
            return Verdict("await_approval", reason="needs a human", decision="awaiting_approval")

        def after_call(self, tool, result, ctx):
            return result

    model = ScriptedModel([call("add", a=1, b=1), "unused"])
    result = Agent(model, tools=[add], policy=NeedsApproval()).run("go")
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    assert model.calls == 1


def test_policy_refusal_is_an_error_the_model_sees():
    class Refuse(BasePolicy):
        async def before_call(self, tool, args, call, ctx):
            return Verdict("refuse", reason=f"user {ctx.user} may not use {tool.name}", decision="refused:authz")

        def after_call(self, tool, result, ctx):
            return result

    model = ScriptedModel([call("add", a=1, b=1), "I was not allowed"])
    result = Agent(model, tools=[add], policy=Refuse(), user="bob").run("go")
    assert result.stop_reason is StopReason.COMPLETED
    assert result.messages[2].content == "ERROR: 'add' was not run: user bob may not use add"
    assert next(e for e in result.trace if e.kind == "tool_call").data["decision"] == "refused:authz"
    assert result.findings == []


async def test_parallel_async_tools_run_concurrently_and_are_bounded():
    active = 0
    peak = 0

    @tool
    async def sleepy(i: int) -> int:
        """Sleep a little."""
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        return i

    calls = [call("sleepy", i=i) for i in range(12)]
    agent = Agent(ScriptedModel([calls, "done"]), tools=[sleepy], limits=Limits(max_parallel_tools=8))
    result = await agent.arun("go")
    assert result.stop_reason is StopReason.COMPLETED
    assert peak == 8
    # results come back in call order, answered by id
    tool_msgs = [m for m in result.messages if m.role == "tool"]
    assert [m.tool_call_id for m in tool_msgs] == [c.id for c in calls]
    assert [m.content for m in tool_msgs] == [str(i) for i in range(12)]


def test_parallel_sync_tools_run_in_threads():
    barrier = threading.Barrier(4, timeout=HANG)

    @tool
    def meet(i: int) -> str:
        """Wait for the others (only succeeds if 4 run at once)."""
        barrier.wait()
        return f"met {i}"

    result = Agent(ScriptedModel([[call("meet", i=i) for i in range(4)], "ok"]), tools=[meet]).run("go")
    assert [m.content for m in result.messages if m.role == "tool"] == [f"met {i}" for i in range(4)]


def test_stream_yields_events_then_result():
    async def collect():
        agent = Agent(ScriptedModel([call("add", a=1, b=1), "two"]), tools=[add])
        return [item async for item in agent.stream("go")]

    items = asyncio.run(collect())
    assert isinstance(items[-1], RunResult)
    kinds = [i.kind for i in items[:-1]]
    assert "text_delta" in kinds and kinds[-1] == "stop"
    assert items[-1].answer == "two"


def test_conversation_continues_from_history():
    model = ScriptedModel(["Hello Ada", "Your name is Ada"])
    agent = Agent(model, instructions="sys")
    first = agent.run("My name is Ada")
    second = agent.run("What is my name?", state=agent.state_from(first.messages))
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert model.requests[1].messages[2].content == "Hello Ada"


def test_run_result_round_trips_through_json():
    result = Agent(ScriptedModel([call("add", a=1, b=2), "3"]), tools=[add]).run("go")
    back = from_json(RunResult, to_json(result))
    assert back == result
    assert back.stop_reason is StopReason.COMPLETED
    assert back.messages[1].tool_calls[0].arguments == {"a": 1, "b": 2}


def test_record_then_replay_gives_the_same_run(tmp_path):
    cassette = tmp_path / "run.jsonl"
    live = RecordingModel(ScriptedModel([call("add", a=4, b=5), reply("9", input_tokens=7)]), cassette)
    first = Agent(live, tools=[add]).run("4+5?")
    replayed = Agent(ReplayModel(cassette), tools=[add]).run("4+5?")
    assert replayed.answer == first.answer == "9"
    assert replayed.usage.input_tokens == 7
    with pytest.raises(Exception, match="differs from the recording"):
        asyncio.run(ReplayModel(cassette).complete(ModelRequest([])))


async def test_cancel_token_interrupts_running_tools_and_keeps_finished_results_in_order():
    token = CancelToken()
    slow_started = asyncio.Event()

    @tool
    async def quick(x: int) -> str:
        """Returns at once."""
        return "quick result"

    @tool
    async def stuck(x: int) -> str:
        """Never returns."""
        slow_started.set()
        await asyncio.sleep(3600)
        return "never"

    calls = [call("stuck", x=1), call("quick", x=2)]
    agent = Agent(ScriptedModel([calls, "unused"]), tools=[quick, stuck])
    task = asyncio.create_task(agent.arun("go", cancel=token))
    await slow_started.wait()
    await asyncio.sleep(0.01)
    token.cancel("user pressed stop")  # the CLI's Ctrl-C: must not wait for the tool to finish
    result = await asyncio.wait_for(task, HANG)  # the tool sleeps for an hour
    assert result.stop_reason is StopReason.CANCELLED and result.error == "user pressed stop"
    tool_msgs = [m for m in result.messages if m.role == "tool"]
    assert [m.tool_call_id for m in tool_msgs] == [c.id for c in calls]
    assert "cancelled" in tool_msgs[0].content and tool_msgs[1].content == "quick result"
    assert result.findings == ['quick({"x": 2}) -> quick result']


async def test_task_cancellation_mid_turn_keeps_the_results_of_tools_that_ran():
    ran: list[str] = []
    started = asyncio.Event()

    @tool
    async def write_note(text: str) -> str:
        """Has an effect, then returns."""
        ran.append(text)
        return "written"

    @tool
    async def stuck(x: int) -> str:
        """Never returns."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    agent = Agent(ScriptedModel([[call("write_note", text="hi"), call("stuck", x=1)]]), tools=[write_note, stuck])
    task = asyncio.create_task(agent.arun("go"))
    await started.wait()
    await asyncio.sleep(0.01)
    task.cancel()
    result = await task
    assert result.stop_reason is StopReason.CANCELLED and ran == ["hi"]
    contents = [m.content for m in result.messages if m.role == "tool"]
    assert contents[0] == "written"  # it did run: the transcript must not claim otherwise
    assert contents[1].startswith("ERROR:") and "cancelled" in contents[1]


async def test_cancelling_the_run_task_also_cancels_the_model_call():
    cancelled = asyncio.Event()
    entered = asyncio.Event()

    class SlowModel:
        name = "slow"

        async def complete(self, request):
            entered.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        def stream(self, request):  # pragma: no cover - not used
            raise NotImplementedError

    task = asyncio.create_task(Agent(SlowModel()).arun("go", cancel=CancelToken()))
    await entered.wait()
    task.cancel()
    result = await task
    assert result.stop_reason is StopReason.CANCELLED
    await asyncio.sleep(0)
    assert cancelled.is_set()  # not left running as an orphaned task


def test_a_failing_tool_step_runner_ends_with_error_and_a_valid_transcript():
    from tether._loop import DirectStepRunner

    class BrokenStore(DirectStepRunner):
        async def tool_step(self, step, index, call, run):
            raise OSError("checkpoint store unavailable")

    model = ScriptedModel([[call("add", a=1, b=2), call("add", a=3, b=4)], "unused"])
    result = Agent(model, tools=[add], step_runner=BrokenStore()).run("go")
    assert result.stop_reason is StopReason.ERROR
    assert "OSError: checkpoint store unavailable" in (result.error or "")
    assistant = result.messages[-3]
    assert [m.tool_call_id for m in result.messages[-2:]] == [c.id for c in assistant.tool_calls]
    assert result.trace[-1].kind == "stop"


async def test_a_slow_model_call_is_bounded_by_the_time_budget():
    class SlowToolCaller:
        name = "slow"

        async def complete(self, request):
            if request.tool_choice != "none":
                await asyncio.sleep(3600)  # longer than the hang bound below: only the budget ends it in time
                return reply("", call("add", a=1, b=1))
            return reply("partial: nothing found in time")

        def stream(self, request):  # pragma: no cover - not used
            raise NotImplementedError

    agent = Agent(SlowToolCaller(), tools=[add], limits=Limits(max_seconds=0.3))
    result = await asyncio.wait_for(agent.arun("go"), HANG)
    assert result.stop_reason is StopReason.TIME_BUDGET
    assert result.answer == "partial: nothing found in time"
    assert result.usage.seconds < 10  # interrupted at the budget, not after the model's 30 s


def test_loop_stop_without_a_final_call_does_not_run_the_turns_other_calls():
    ran: list[str] = []

    @tool
    def note(key: str) -> str:
        """Record a key."""
        ran.append(key)
        return "ok"

    def script(req: ModelRequest):
        n = len(req.messages)
        return [call("note", key="same"), call("note", key=f"fresh{n}")]

    result = Agent(ScriptedModel(script), tools=[note], limits=Limits(max_repeats=1, final_answer=False)).run("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    # turn 1 runs both, turn 2 warns on "same" and runs the fresh one, turn 3 stops: nothing reads its results
    assert ran == ["same", "fresh1", "fresh4"]
    last_turn = result.messages[-2:]
    assert all(m.role == "tool" and m.content.startswith("ERROR") for m in last_turn)


def test_the_final_answer_call_streams_its_text_too():
    async def collect():
        agent = Agent(ScriptedModel(endless), tools=[lookup], limits=Limits(max_steps=1))
        return [item async for item in agent.stream("go")]

    items = asyncio.run(collect())
    deltas = [i.data["text"] for i in items[:-1] if i.kind == "text_delta"]
    assert deltas == ["partial: I found some values"]
    assert items[-1].answer == "partial: I found some values"


def test_a_cost_reported_by_the_model_is_kept_when_the_price_table_does_not_know_it():
    class BilledModel:
        name = "house-model"

        async def complete(self, request):
            return ModelReply("done", usage=Usage(10, 5, cost_usd=0.25))

        def stream(self, request):  # pragma: no cover - not used
            raise NotImplementedError

    result = Agent(BilledModel()).run("go")
    assert result.usage.cost_usd == pytest.approx(0.25)
    priced = Agent(BilledModel(), pricing=Pricing({"house-model": (1_000_000.0, 0.0)})).run("go")
    assert priced.usage.cost_usd == pytest.approx(10.0)


@tool(effect="read_only")
async def fetch_note(key: str) -> str:
    """A note (trusted output)."""
    return f"note {key}: the value is {len(key) * 7}"


@tool(effect="read_only", untrusted_output=True)
async def fetch_page(key: str) -> str:
    """A web page (untrusted output: the run is tainted from its first result on)."""
    return f"page {key}: see https://example.com/{key} for the value {len(key) * 7}"


def _calls_per_run(tool_name: str, steps: int) -> int:
    """Python and C function calls made by one run of `steps` tool calls (exact, load-independent)."""
    import sys

    def script(req: ModelRequest):
        n = len(req.messages)
        return "done" if n >= 2 * steps else call(tool_name, key=f"item-{n}")

    agent = Agent(ScriptedModel(script), tools=[fetch_note, fetch_page], limits=Limits(max_steps=steps + 5))
    asyncio.run(agent.arun("go"))  # warm up (imports, caches)
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    async def go():
        sys.setprofile(profile)
        try:
            await agent.arun("go")
        finally:
            sys.setprofile(None)

    asyncio.run(go())
    return count


@pytest.mark.parametrize("tool_name", ["fetch_note", "fetch_page"])
def test_work_per_step_stays_flat_as_the_history_grows(tool_name):
    # the calls a step adds, early in a run and late in a longer one: per-step work (policy
    # provenance, loop guards, events) must not grow with what the run has already read
    early = (_calls_per_run(tool_name, 40) - _calls_per_run(tool_name, 20)) / 20
    late = (_calls_per_run(tool_name, 160) - _calls_per_run(tool_name, 80)) / 80
    assert late <= early * 1.05, (early, late)


def test_cancel_from_another_thread_interrupts_a_synchronous_run() -> None:
    """Issue 24, item 3: `CancelToken.cancel()` from a thread while a sync `agent.run()` waits on a
    model call ends the run at once (before: asyncio.Event is not thread-safe, the run sat out the hang)."""
    token = CancelToken()
    started = threading.Event()

    class Hanging:
        name = "hanging"

        async def complete(self, request: ModelRequest) -> ModelReply:
            started.set()
            await asyncio.sleep(3600)
            raise AssertionError("not reached")

        async def stream(self, request: ModelRequest):  # pragma: no cover
            yield await self.complete(request)

    threading.Thread(target=lambda: (started.wait(HANG), token.cancel("stopped from a thread")), daemon=True).start()
    done: list[RunResult] = []
    runner = threading.Thread(target=lambda: done.append(Agent(Hanging()).run("go", cancel=token)), daemon=True)
    runner.start()
    runner.join(HANG)  # a generous guard: the run ends as soon as the cancel lands
    assert done, "the run did not end after the cancel"
    assert done[0].stop_reason is StopReason.CANCELLED
    assert done[0].error == "stopped from a thread"


def test_limits_can_be_set_for_one_run() -> None:
    """`run(..., limits=)` bounds that run instead of the agent's limits; the next run has the agent's."""
    from tether import Agent, Limits, ScriptedModel, StopReason, call, tool

    @tool
    def noop() -> str:
        """Nothing."""
        return "ok"

    script = [call("noop"), call("noop"), call("noop"), "done"]
    agent = Agent(ScriptedModel(script * 2), tools=[noop], limits=Limits(max_steps=10))
    capped = agent.run("go", limits=Limits(max_steps=2))
    assert capped.stop_reason is StopReason.MAX_STEPS and capped.steps <= 2
    assert agent.limits.max_steps == 10
