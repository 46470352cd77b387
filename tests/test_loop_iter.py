"""`agent.iter()` (issue 38, item 5): a run stepped node by node takes the same branches, emits the
same events and ends with the same RunResult as `agent.arun()`, on every path: tools, budgets,
approvals, cancellation, sub-agents, per-run limits."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_loop import FakeClock, add, endless, lookup  # the same fixtures as the loop's tests
from test_policy_decisions import World

from tether import Agent, CancelToken, InvalidInput, Limits, StopReason, tool
from tether._tokens import EstimateCounter, MessageSizes, message_tokens
from tether._types import Message, RunResult, RunState, ToolCall, to_json
from tether.models._scripted import ScriptedModel, call
from tether.policy import ApprovalBook, PendingApprover, SafetyPolicy
from tether.steps import Admit, CallModel, End, Execute, Observe, PlanCalls, Start, Step, StopRun


async def stepped(agent: Agent, prompt: str | None, **kw: Any) -> tuple[list[Step], RunResult]:
    nodes: list[Step] = []
    async with agent.iter(prompt, run_id="r", **kw) as run:
        async for node in run:
            nodes.append(node)
    assert run.result is not None and isinstance(nodes[-1], End) and nodes[-1].result is run.result
    return nodes, run.result


async def same_both_ways(make: Callable[[], Agent], prompt: str | None = "go", **kw: Any) -> tuple[list[Step], RunResult]:
    """Run a fresh agent by arun and another by iter; everything they return must be equal."""
    direct = await make().arun(prompt, run_id="r", **kw)
    nodes, by_steps = await stepped(make(), prompt, **kw)
    assert canonical(by_steps) == canonical(direct)
    assert [e.kind for e in by_steps.trace] == [e.kind for e in direct.trace] and by_steps.trace
    return nodes, by_steps


def canonical(result: RunResult) -> str:
    """The result as JSON, the scripted models' call ids (a process-wide counter) numbered from the run's first."""
    text = to_json(result)
    ids: dict[str, str] = {}
    return re.sub(r"call_\d+", lambda m: ids.setdefault(m.group(), f"call#{len(ids)}"), text)


def kinds(nodes: list[Step]) -> list[str]:
    return [type(n).__name__ for n in nodes]


async def test_each_step_is_yielded_before_it_runs_and_the_end_is_arun_s_result() -> None:
    nodes, result = await same_both_ways(
        lambda: Agent(ScriptedModel([call("add", a=2, b=3), "5"]), tools=[add], clock=FakeClock()))
    assert result.stop_reason is StopReason.COMPLETED and result.answer == "5"
    assert kinds(nodes) == ["Start", "Admit", "CallModel", "PlanCalls", "Execute", "Observe",
                            "Admit", "CallModel", "PlanCalls", "StopRun", "End"]
    assert isinstance(nodes[2], CallModel) and nodes[2].request.tools[0].name == "add"
    execute, observe = nodes[4], nodes[5]
    assert isinstance(execute, Execute) and execute.calls[0].arguments == {"a": 2, "b": 3}
    assert isinstance(observe, Observe) and observe.results[0] is not None and observe.results[0].content == "5"
    stop = nodes[-2]
    assert isinstance(stop, StopRun) and stop.reason is StopReason.COMPLETED


async def test_the_caller_sees_the_request_before_it_is_sent_and_the_run_state_between_steps() -> None:
    model = ScriptedModel([call("lookup", key="a"), "done"])
    agent = Agent(model, tools=[lookup], clock=FakeClock())
    async with agent.iter("go") as run:
        async for node in run:
            if isinstance(node, CallModel):
                if not model.requests:  # the first request, as it will be sent
                    assert [m.content for m in node.request.messages] == ["go"]
                sent = len(model.requests)
                assert run.usage is not None and run.usage.model_calls == sent  # not sent yet
            if isinstance(node, PlanCalls):
                assert len(model.requests) == sent + 1
                assert node.reply.text == "" or node.reply.text == "done"
    assert run.result is not None and run.result.usage.model_calls == 2


async def test_budgets_hit_end_alike_with_the_final_answer() -> None:
    nodes, result = await same_both_ways(
        lambda: Agent(ScriptedModel(endless), tools=[lookup], clock=FakeClock(), limits=Limits(max_steps=3)))
    assert result.stop_reason is StopReason.MAX_STEPS and result.answer == "partial: I found some values"
    stop = nodes[-2]
    assert isinstance(stop, StopRun) and stop.reason is StopReason.MAX_STEPS
    # token ceiling: each request sized and admitted in the Admit step
    _, result = await same_both_ways(
        lambda: Agent(ScriptedModel(endless), tools=[lookup], clock=FakeClock(),
                      limits=Limits(max_tokens=600, max_steps=50)))
    assert result.stop_reason is StopReason.TOKEN_BUDGET


async def test_per_run_limits_are_taken_by_iter_as_by_arun() -> None:
    def make() -> Agent:
        return Agent(ScriptedModel(endless), tools=[lookup], clock=FakeClock(), limits=Limits(max_steps=50))

    nodes, result = await same_both_ways(make, limits=Limits(max_steps=2))
    assert result.stop_reason is StopReason.MAX_STEPS  # not the agent's 50
    assert result.usage.model_calls == 3 and result.usage.tool_calls == 1  # two steps (the second's call not run), the final answer
    assert sum(isinstance(n, CallModel) for n in nodes) == 2


async def test_a_time_budget_hit_by_a_tool_ends_alike() -> None:
    def make() -> Agent:
        clock = FakeClock()

        @tool
        def slow(key: str) -> str:
            """Take a minute."""
            clock.t += 60
            return key

        return Agent(ScriptedModel([call("slow", key="a"), call("slow", key="b"), "x", "partial"]), tools=[slow],
                     clock=clock, limits=Limits(max_seconds=100))

    _, result = await same_both_ways(make)
    assert result.stop_reason is StopReason.TIME_BUDGET


async def test_approvals_stop_alike_and_the_decided_run_continues_alike() -> None:
    pay = {"recipient": "ACME-IBAN-0001", "amount": 20}
    worlds: list[World] = []

    def make() -> Agent:
        world = World()
        worlds.append(world)
        return Agent(ScriptedModel([call("read_email"), call("send_money", **pay), "paid"]), tools=world.tools(),
                     policy=SafetyPolicy(approver=PendingApprover(ApprovalBook())), clock=FakeClock())

    _, first = await same_both_ways(make, "pay the invoice in my email")
    assert first.stop_reason is StopReason.AWAITING_APPROVAL
    # the decided run continues from its state (through JSON), by arun on one agent and by iter on another
    results = []
    for by_steps in (False, True):
        agent = make()
        parked = await agent.arun("pay the invoice in my email", run_id="r")
        assert parked.state is not None
        state = RunState.from_json(parked.state.to_json()).approve(parked.pending[0]["call_id"], by="alice")
        if by_steps:
            nodes, done = await stepped(agent, None, state=state)
            assert kinds(nodes)[:2] == ["Start", "Admit"]  # the decided call runs in Start
        else:
            done = await agent.arun(None, state=state, run_id="r")
        results.append(done)
    direct, by_steps_result = results
    assert by_steps_result.stop_reason is StopReason.COMPLETED, by_steps_result.error
    assert canonical(by_steps_result) == canonical(direct)
    assert worlds[-1].sent == worlds[-2].sent == [{**pay, "note": ""}]


class WaitingRunner:
    """An in-memory step runner that can wait for a decision (as a service's runner does)."""

    def __init__(self) -> None:
        self.asked: list[dict] = []

    def begin_turn(self, step: int, indices: list[int]) -> None:
        return None

    async def run_child(self, parent_run_id, child, run):
        return await run()

    async def model_step(self, step, run):
        return await run()

    async def tool_step(self, step, index, call, run):
        return await run()

    async def wait_approval(self, run_id: str, pending: dict) -> dict | None:
        self.asked.append(pending)
        return {"call_id": pending["call_id"], "approved": True, "by": "bob", "reason": ""}


async def test_a_run_that_waits_for_a_decision_mid_turn_steps_alike() -> None:
    pay = {"recipient": "ACME-IBAN-0001", "amount": 20}

    def make() -> Agent:
        world = World()
        return Agent(ScriptedModel([call("read_email"), call("send_money", **pay), "paid"]), tools=world.tools(),
                     policy=SafetyPolicy(approver=PendingApprover(ApprovalBook())), clock=FakeClock(),
                     step_runner=WaitingRunner())

    _, result = await same_both_ways(make, "pay the invoice in my email")
    assert result.stop_reason is StopReason.COMPLETED, result.error
    assert "approval_decided" in [e.kind for e in result.trace]


async def test_cancellation_from_a_tool_ends_alike_with_every_call_answered() -> None:
    def make() -> Agent:
        token = CancelToken()

        @tool
        async def stop_it(key: str) -> str:
            """Cancel the run, then finish."""
            token.cancel("user pressed stop")
            return key

        agent = Agent(ScriptedModel([call("stop_it", key="a"), "never"]), tools=[stop_it], clock=FakeClock())
        agent._test_token = token  # type: ignore[attr-defined]
        return agent

    direct_agent, iter_agent = make(), make()
    direct = await direct_agent.arun("go", run_id="r", cancel=direct_agent._test_token)  # type: ignore[attr-defined]
    nodes, by_steps = await stepped(iter_agent, "go", cancel=iter_agent._test_token)  # type: ignore[attr-defined]
    assert canonical(by_steps) == canonical(direct)
    assert by_steps.stop_reason is StopReason.CANCELLED and by_steps.error == "user pressed stop"
    assert kinds(nodes)[-3:] == ["Admit", "StopRun", "End"]  # the guard before the next model call stopped it


async def test_leaving_iter_early_stops_the_run_cancelled_and_answers_its_open_calls() -> None:
    model = ScriptedModel([call("lookup", key="a"), "never"])
    agent = Agent(model, tools=[lookup], clock=FakeClock())
    async with agent.iter("go") as run:
        async for node in run:
            if isinstance(node, Execute):
                break  # the calls are planned, not run
    result = run.result
    assert result is not None and result.stop_reason is StopReason.CANCELLED
    assert result.error == "the caller left agent.iter() before the run ended"
    assert [m.role for m in result.messages] == ["user", "assistant", "tool"]
    assert result.messages[-1].content.startswith("ERROR: not run")
    assert result.usage.tool_calls == 0 and [e.kind for e in result.trace][-2:] == ["notice", "stop"]


async def test_a_sub_agent_runs_alike_inside_a_stepped_parent() -> None:
    def make() -> Agent:
        child = Agent(ScriptedModel([call("add", a=1, b=2), "three"]), tools=[add], name="adder", clock=FakeClock())
        return Agent(ScriptedModel([call("adder", task="add 1 and 2"), "the child said three"]),
                     tools=[child.as_tool("adder", "Adds.")], clock=FakeClock(), limits=Limits(max_tokens=100_000))

    _, result = await same_both_ways(make)
    assert result.stop_reason is StopReason.COMPLETED
    assert result.usage.model_calls == 4  # the child's two calls charged to the parent


async def test_an_output_type_retry_steps_back_to_admit() -> None:
    def make() -> Agent:
        return Agent(ScriptedModel(["not a number", "42"]), output_type=int, clock=FakeClock())

    nodes, result = await same_both_ways(make)
    assert result.output == 42
    assert kinds(nodes) == ["Start", "Admit", "CallModel", "PlanCalls", "Admit", "CallModel", "PlanCalls", "StopRun",
                            "End"]


async def test_iter_refuses_a_durable_agent_and_misuse_in_one_clear_error() -> None:
    agent = Agent(ScriptedModel(["x"]))
    agent.durable = object()  # (what `durable=` attaches; no database is needed to refuse)
    with pytest.raises(InvalidInput, match="durable agent"):
        agent.iter("go")
    run = Agent(ScriptedModel(["x"])).iter("go")
    with pytest.raises(InvalidInput, match="async with"):
        await run.next()
    async with run:
        assert isinstance(await run.next(), Start) and isinstance(await run.next(), Admit)
    with pytest.raises(InvalidInput, match="entered once"):
        async with run:
            pass
    assert run.result is not None and run.result.stop_reason is StopReason.CANCELLED


# Per-turn work the stepping split went with (bench.overhead): the same figures, computed with less.

@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80)
       | st.text(alphabet="ab_Z09 \n\t\r-{}\":,.", max_size=200))
def test_the_ascii_token_estimate_is_the_piece_by_piece_estimate(text: str) -> None:
    counter = EstimateCounter()
    assert counter.count(text) == (counter._count_pieces(text) if text else 0)
    assert counter._count_ascii(text) == counter._count_pieces(text) or not text


def test_admission_counts_each_new_message_once_as_the_bounded_sizes_do() -> None:
    counter = EstimateCounter()
    exact, bounded = MessageSizes(counter), MessageSizes(counter)
    messages = [Message.user("look up  the  keys: 12345, abc_def")]
    for i in range(6):
        bounded.sync(messages)
        assert exact.exact(messages) == bounded.total() == sum(message_tokens(counter, m) for m in messages)
        messages.append(Message.assistant("", [ToolCall(f"c{i}", "lookup", {"key": f"k{i}", "n": i})]))
        messages.append(Message("tool", f"value of k{i}\n\n  done", tool_call_id=f"c{i}", name="lookup"))
    bounded.sync(messages)
    assert exact.exact(list(messages)) == bounded.total()  # another list: counted afresh, same figure
