"""Any policy bounds the sub-agents below its run (`Policy.bound_descendants`): a call a run above
refuses is never run, whatever the sub-agent's own policy (issue: bounds from any policy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import Agent, Limits, tool
from tether._types import ModelReply, ModelRequest, StopReason, ToolCall
from tether.models._scripted import ScriptedModel
from tether.tools._base import Tool, ToolContext
from tether.tools._executor import ALLOW, POLICY_HOOKS, AllowAll, BasePolicy, CallContext, Verdict

LEAVES = ("read_a", "write_b", "delete_all", "send_c")


class Refuses(BasePolicy):
    """A custom policy that refuses some tools by name (and allows everything else)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    async def before_call(self, tool: Tool, args: dict[str, Any], call: ToolCall, ctx: CallContext) -> Verdict:
        if tool.name in self.names:
            return Verdict("refuse", f"{tool.name} is not allowed here", "refused:custom")
        return ALLOW


def leaf_tools(ran: list[tuple[str, str]]) -> dict[str, Tool]:
    def make(name: str) -> Tool:
        async def body(target: str, context: ToolContext) -> str:
            ran.append((context.run_id, name))
            return f"{name} done on {target}"

        return tool(name=name, effect="read_only")(body)

    return {name: make(name) for name in LEAVES}


def calling_each(names: list[str]) -> ScriptedModel:
    """A model that calls each tool in `names` once, in order (one a turn), then answers."""

    def step(request: ModelRequest) -> ModelReply:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < len(names):
            arguments = {"task": "do it"} if names[done].startswith("sub") else {"target": "everything"}
            return ModelReply("", [ToolCall(f"call_{done}", names[done], arguments)])
        return ModelReply("done")

    return ScriptedModel(step)


@dataclass
class Node:
    refuses: frozenset[str] | None  # None: AllowAll
    leaves: list[str]
    children: list[Node] = field(default_factory=list)


nodes = st.recursive(
    st.builds(Node, st.none() | st.frozensets(st.sampled_from(LEAVES)), st.lists(st.sampled_from(LEAVES), max_size=3,
                                                                                 unique=True)),
    lambda kids: st.builds(Node, st.none() | st.frozensets(st.sampled_from(LEAVES)),
                           st.lists(st.sampled_from(LEAVES), max_size=3, unique=True), st.lists(kids, max_size=2)),
    max_leaves=6,
)


def build(node: Node, tools: dict[str, Tool], names: dict[str, Node], counter: list[int]) -> Agent:
    subs = []
    for child in node.children:
        counter[0] += 1
        name = f"sub{counter[0]}"
        names[name] = child
        subs.append(build(child, tools, names, counter).as_tool(name, share=0.5))
    policy = AllowAll() if node.refuses is None else Refuses(node.refuses)
    order = [*node.leaves, *(s.name for s in subs)]
    return Agent(calling_each(order), tools=[*(tools[n] for n in node.leaves), *subs], policy=policy,
                 limits=Limits(max_steps=10))


def refused_by(node: Node, name: str) -> bool:
    return node.refuses is not None and name in node.refuses


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(root=nodes)
def test_no_call_an_ancestor_refuses_is_ever_run(root: Node) -> None:
    ran: list[tuple[str, str]] = []
    names: dict[str, Node] = {}
    agent = build(root, leaf_tools(ran), names, [0])
    agent.run("go", run_id="root")
    for run_id, name in ran:
        path = [root, *(names[seg.split(":")[0]] for seg in run_id.split(".")[1:])]
        assert not any(refused_by(n, name) for n in path), (run_id, name)
    # and every call no run on its path refuses did run (the bound is not refusing everything)
    expected: list[tuple[tuple[str, ...], str]] = []

    def walk(node: Node, above: list[Node], path: tuple[str, ...]) -> None:
        chain = [*above, node]
        expected.extend((path, leaf) for leaf in node.leaves if not any(refused_by(n, leaf) for n in chain))
        for name, child in names.items():
            if any(child is c for c in node.children):
                walk(child, chain, (*path, name))

    walk(root, [], ())
    seen = sorted((tuple(seg.split(":")[0] for seg in run_id.split(".")[1:]), name) for run_id, name in ran)
    assert seen == sorted(expected)


def test_a_parent_that_refuses_delete_all_stops_its_allow_all_child() -> None:
    """The issue's case: a parent whose BasePolicy.before_call refuses delete_all did not stop a child
    under AllowAll from running delete_all('everything')."""
    ran: list[tuple[str, str]] = []
    tools = leaf_tools(ran)
    child_model = calling_each(["delete_all"])
    child = Agent(child_model, tools=[tools["delete_all"]], policy=AllowAll())
    parent = Agent(calling_each(["sub_cleaner"]), tools=[child.as_tool("sub_cleaner")],
                   policy=Refuses(frozenset({"delete_all"})))
    result = parent.run("clean up")
    assert result.stop_reason is StopReason.COMPLETED
    assert ran == []
    told = [m.content for m in child_model.requests[-1].messages if m.role == "tool"]
    assert told and "'delete_all' was not run: a run above this one refuses it" in told[0]


def test_a_policy_without_the_hook_bounds_through_its_before_call() -> None:
    """A policy written against the protocol alone (no BasePolicy) still bounds its sub-agents."""

    class Plain:  # every hook but bound_descendants
        def __init__(self, names: frozenset[str]) -> None:
            self.names = names

    for hook in POLICY_HOOKS:
        setattr(Plain, hook, getattr(Refuses, hook))
    assert not hasattr(Plain, "bound_descendants")
    ran: list[tuple[str, str]] = []
    tools = leaf_tools(ran)
    child = Agent(calling_each(["delete_all", "read_a"]), tools=[tools["delete_all"], tools["read_a"]],
                  policy=AllowAll())
    parent = Agent(calling_each(["sub_x"]), tools=[child.as_tool("sub_x")], policy=Plain(frozenset({"delete_all"})))  # type: ignore[arg-type]
    parent.run("go")
    assert [name for _, name in ran] == ["read_a"]


def test_a_durable_child_is_bounded_by_its_parents_custom_policy(tmp_path) -> None:
    """A durable sub-agent runs as a workflow of its own (recovered apart from its parent's run): the
    parent's policy still bounds it, through a fresh state of that policy."""
    pytest.importorskip("dbos")
    from tether.durable import teardown

    ran: list[tuple[str, str]] = []
    tools = leaf_tools(ran)
    child = Agent(calling_each(["delete_all", "read_a"]), tools=[tools["delete_all"], tools["read_a"]],
                  policy=AllowAll())
    parent = Agent(calling_each(["sub_cleaner"]), tools=[child.as_tool("sub_cleaner")],
                   policy=Refuses(frozenset({"delete_all"})), name="bounded_parent", durable=str(tmp_path / "runs.db"))
    try:
        result = parent.run("clean up", run_id="bp1")
    finally:
        teardown()
    assert result.stop_reason is StopReason.COMPLETED
    assert [name for _, name in ran] == ["read_a"]


class PerRun(BasePolicy):
    """A custom per-run rate limit: at most `limit` calls of each tool in a run, counted when let
    through and kept pending (by call id) until the result is in, as a real policy's state would be."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.states: dict[str, dict[str, Any]] = {}

    def start_run(self, run_id: str, user: str | None, user_texts: list[str], tool_outputs: list[str]) -> Any:
        state: dict[str, Any] = {"calls": {}, "pending": {}}
        self.states.setdefault(run_id, state)
        return state

    async def before_call(self, tool: Tool, args: dict[str, Any], call: ToolCall, ctx: CallContext) -> Verdict:
        state = ctx.policy_state
        if state["calls"].get(tool.name, 0) >= self.limit:
            return Verdict("refuse", f"{tool.name} may run {self.limit} time(s) per run", "refused:rate_limit")
        state["calls"][tool.name] = state["calls"].get(tool.name, 0) + 1
        state["pending"][call.id] = tool.name
        return ALLOW

    def after_call(self, tool: Tool, result: Any, ctx: CallContext) -> Any:
        ctx.policy_state["pending"].pop(result.call_id, None)
        return result


def test_checking_a_childs_calls_spends_nothing_of_the_parents_rate_limit() -> None:
    """An ancestor's check of a descendant's call is a question: the child's N checked calls leave the
    parent's N calls of the same tool to the parent, and no pending entry in the parent's state."""
    ran: list[tuple[str, str]] = []
    tools = leaf_tools(ran)
    child = Agent(calling_each(["read_a", "read_a"]), tools=[tools["read_a"]], policy=AllowAll())
    policy = PerRun(2)
    parent = Agent(calling_each(["sub_reader", "read_a", "read_a"]), tools=[child.as_tool("sub_reader"), tools["read_a"]],
                   policy=policy, limits=Limits(max_steps=10))
    result = parent.run("read twice, and have the child read twice", run_id="p")
    assert result.stop_reason is StopReason.COMPLETED
    assert [(run_id == "p", name) for run_id, name in ran] == [(False, "read_a")] * 2 + [(True, "read_a")] * 2
    parent_state = policy.states["p"]
    assert parent_state == {"calls": {"sub_reader": 1, "read_a": 2}, "pending": {}}


def test_a_parent_whose_rate_limit_is_spent_still_refuses_its_childs_call() -> None:
    """A pure question still refuses what the ancestor would refuse now: its own calls spent its limit."""
    ran: list[tuple[str, str]] = []
    tools = leaf_tools(ran)
    child_model = calling_each(["read_a"])
    child = Agent(child_model, tools=[tools["read_a"]], policy=AllowAll())
    policy = PerRun(1)
    parent = Agent(calling_each(["read_a", "sub_reader"]), tools=[child.as_tool("sub_reader"), tools["read_a"]],
                   policy=policy, limits=Limits(max_steps=10))
    parent.run("go", run_id="p")
    assert [run_id for run_id, _ in ran] == ["p"]
    told = [m.content for m in child_model.requests[-1].messages if m.role == "tool"]
    assert told and "a run above this one refuses it (read_a may run 1 time(s) per run)" in told[0]
    assert policy.states["p"] == {"calls": {"read_a": 1, "sub_reader": 1}, "pending": {}}


def test_a_state_that_cannot_be_copied_is_asked_through_the_policys_own_serialisation() -> None:
    """A run state holding a lock (no deep copy) is copied by `dump_state`/`load_state` for the
    question; the live state is left as it was."""
    import asyncio
    import threading

    from tether.tools._executor import PolicyBound

    class Locked(PerRun):
        def start_run(self, run_id: str, user: str | None, user_texts: list[str], tool_outputs: list[str]) -> Any:
            return {**super().start_run(run_id, user, user_texts, tool_outputs), "lock": threading.Lock()}

        def dump_state(self, state: Any) -> dict[str, Any]:
            return {"calls": dict(state["calls"]), "pending": dict(state["pending"])}

        def load_state(self, data: dict[str, Any]) -> Any:
            return {"calls": dict(data["calls"]), "pending": dict(data["pending"]), "lock": threading.Lock()}

    policy = Locked(1)
    ctx = CallContext("p", policy_state=policy.start_run("p", None, [], []))
    read_a = leaf_tools([])["read_a"]
    bound = PolicyBound(policy, ctx)
    assert asyncio.run(bound.refusal(read_a, {"target": "x"}, None)) is None
    assert asyncio.run(bound.refusal(read_a, {"target": "x"}, None)) is None  # the first one counted nothing
    assert ctx.policy_state["calls"] == {} and ctx.policy_state["pending"] == {}
    ctx.policy_state["calls"]["read_a"] = 1  # the run's own call spent the limit
    assert "may run 1 time(s) per run" in str(asyncio.run(bound.refusal(read_a, {"target": "x"}, None)))
