"""The plan interpreter: what it runs, what it refuses, and that every value carries the sources of
everything that influenced it, checked on hand-picked flows and on random programs (a change to an
input that changes an output must show in that output's sources)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tether.plan import Interpreter, Label, ProgramError, Value, deep_label, plain, tag
from tether.values import join_all


def lab(*sources: str) -> Label:
    """The label of a value from `sources`: trusted when it is the user's request alone."""
    return Label("trusted" if set(sources) <= {"user"} else "untrusted", frozenset(sources))


def run(program: str, env: dict[str, Value] | None = None, tools: dict[str, Any] | None = None) -> Interpreter:
    """Run `program`; tools are plain functions whose results carry "tool:NAME" and their inputs' sources."""
    tools = tools or {}

    async def call_tool(name: str, args: dict[str, Value], pc: Label) -> Value:
        caps = lab(f"tool:{name}") | join_all(deep_label(v) for v in args.values()) | pc
        return tag(tools[name](**{k: plain(v) for k, v in args.items()}), caps)

    interp = Interpreter(set(tools), call_tool, env=dict(env or {}))
    asyncio.run(interp.run(program))
    return interp


def src(interp: Interpreter, name: str) -> set[str]:
    return set(deep_label(interp.env[name]).sources)


def untrusted(v: Any) -> Value:
    return tag(v, lab("tool:inbox"))


def test_operations_carry_every_operands_sources() -> None:
    i = run("a = x + 1\nb = f'{x} and {y}'\nc = [x, 5][1]\nd = {'k': y}['k']\ne = 'z' if x > 0 else 'w'\n"
            "f = len(lst)\ng = lst[0]\nh = 7",
            {"x": untrusted(3), "y": tag("hi", lab("tool:contacts")), "lst": untrusted([1, 2])})
    assert src(i, "a") == {"tool:inbox", "user"}
    assert src(i, "b") == {"tool:inbox", "tool:contacts", "user"}
    assert src(i, "c") == {"user"}  # the element picked by a constant index from a literal list
    assert src(i, "d") == {"tool:contacts", "user"}
    assert src(i, "e") == {"tool:inbox", "user"}  # chosen by an untrusted condition
    assert src(i, "f") == {"tool:inbox"} and src(i, "g") == {"tool:inbox", "user"} and src(i, "h") == {"user"}


def test_a_branch_taints_what_it_assigns_even_when_not_taken() -> None:
    """`flag` is untrusted: `x` keeps 0 when the branch is not taken, and still depends on `flag`."""
    for flag in (True, False):
        i = run("x = 0\nif flag:\n    x = 1\ny = 2", {"flag": untrusted(flag)})
        assert plain(i.env["x"]) == int(flag)
        assert "tool:inbox" in src(i, "x") and src(i, "y") == {"user"}


def test_a_loop_taints_what_it_assigns_and_appends_by_its_iterable() -> None:
    i = run("n = 0\nout = []\nfor v in items:\n    n += 1\n    out.append('x')\nm = len(out)",
            {"items": untrusted([1, 2, 3])})
    assert plain(i.env["n"]) == 3 and "tool:inbox" in src(i, "n")
    assert "tool:inbox" in src(i, "out") and "tool:inbox" in src(i, "m")
    i = run("out = []\nfor v in items:\n    out.append(v)", {"items": untrusted([])})
    assert "tool:inbox" in src(i, "out")  # empty because the untrusted list was empty


def test_a_comprehension_carries_its_list_and_filter() -> None:
    i = run("picked = [n * 2 for n in nums if n > limit]\nfirst = picked[0]\nsize = len(picked)",
            {"nums": tag([1, 5, 9], lab("tool:db")), "limit": untrusted(4)})
    assert plain(i.env["picked"]) == [10, 18]
    assert {"tool:db", "tool:inbox"} <= src(i, "first") and {"tool:db", "tool:inbox"} <= src(i, "size")


def test_tool_calls_see_the_control_flow_and_results_carry_their_inputs() -> None:
    seen: list[Label] = []

    async def call_tool(name: str, args: dict[str, Value], pc: Label) -> Value:
        seen.append(pc)
        return tag("ok", lab(f"tool:{name}") | join_all(deep_label(v) for v in args.values()) | pc)

    interp = Interpreter({"send"}, call_tool, env={"flag": untrusted(True)})
    asyncio.run(interp.run("if flag:\n    r = send(to='bob')\nfinal_answer(r)"))
    assert seen[0].sources == {"tool:inbox"}
    assert deep_label(interp.answer).sources >= {"tool:send", "tool:inbox", "user"}  # type: ignore[arg-type]


def test_an_assigned_list_is_a_copy_so_an_alias_cannot_hide_a_flow() -> None:
    i = run("a = []\nb = a\nif flag:\n    a.append(1)\nn = len(b)", {"flag": untrusted(True)})
    assert plain(i.env["b"]) == [] and plain(i.env["a"]) == [1]


@pytest.mark.parametrize("program", [
    "import os", "def f():\n    pass", "while True:\n    pass", "x = lambda: 1", "x = (y := 1)",
    "open('f')", "x = {1, 2}", "x = y.__class__", "try:\n    pass\nexcept Exception:\n    pass",
    "for i in range(3):\n    break", "x = [*a]", "__import__('os')", "x = {k: 1 for k in a}",
])
def test_what_is_not_interpreted_is_refused_before_anything_runs(program: str) -> None:
    calls: list[str] = []
    with pytest.raises(ProgramError):
        run("send(to='x')\n" + program, {"a": untrusted([1]), "y": untrusted(1)},
            {"send": lambda to: calls.append(to) or "sent"})
    assert calls == []  # parsed (and refused) before the first statement ran


@pytest.mark.parametrize(("program", "message"), [
    ("x = y", "not assigned"), ("x = [1][5]", "out of range"), ("x = 'a' * 10**7", "repetition over"),
    ("x = range(10**6)", "limited"), ("send = 1", "tool or a builtin"), ("x = nothing(1)", "no tool or function"),
    ("x = {'a': 1}.b", "no field"), ("x = 1 / 0", "ZeroDivisionError"), ("send('bob')", "keyword arguments"),
    ("x = f'{1:>999999999}'", "format spec"), ("x = ('y' * 90000).replace('', 'z' * 90000)", "over"),
    ("s = 'y' * 90000\nx = s.join([s for i in range(5000)])", "over"),
    ("x = 10 ** 60\nfor i in range(5):\n    x = x ** 60", "bits"), ("x = max(**{'a': 1})", "arguments are not"), ("x = ('a ' * 400000).split()", "items"),
])
def test_errors_name_the_line_and_the_problem(program: str, message: str) -> None:
    with pytest.raises(ProgramError, match=message):
        run(program, tools={"send": lambda to: "sent"})


def test_the_operation_budget_stops_a_plan_that_runs_too_long() -> None:
    with pytest.raises(ProgramError, match="operations"):
        run("n = 0\nfor i in range(10000):\n    for j in range(10000):\n        n += 1")


# -- random programs: a difference an input makes must show in the output's sources -------------

NAMES = ["x0", "x1", "x2"]
INPUTS = {"a": "s:a", "b": "s:b", "c": "s:c", "lst": "s:lst"}


def _atom() -> st.SearchStrategy[str]:
    return st.sampled_from(["a", "b", "c", "1", "2", "0", *NAMES, "len(lst)", "lst[0]", "sum(lst)"])


def _expr(depth: int = 2) -> st.SearchStrategy[str]:
    if depth == 0:
        return _atom()
    sub = _expr(depth - 1)
    return st.one_of(
        _atom(),
        st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.sampled_from(["<", "==", ">"]), sub, sub, sub).map(
            lambda t: f"({t[3]} if {t[0]} {t[1]} {t[2]} else {t[4]})"),
        st.tuples(sub, sub).map(lambda t: f"max({t[0]}, {t[1]})"),
        st.tuples(sub).map(lambda t: f"len(f'{{{t[0]}}}')"),
        st.tuples(sub).map(lambda t: f"lst[abs({t[0]}) % len(lst)]"),
        st.tuples(sub, sub).map(lambda t: f"sum([v * {t[0]} for v in lst if v > {t[1]}])"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]} > 0 and {t[1]} > 0)").map(lambda e: f"int({e})"),
    )


def _stmt() -> st.SearchStrategy[str]:
    name = st.sampled_from(NAMES)
    e = _expr()
    return st.one_of(
        st.tuples(name, e).map(lambda t: f"{t[0]} = {t[1]}"),
        st.tuples(name, e).map(lambda t: f"{t[0]} += {t[1]}"),
        st.tuples(e, e, name, e, name, e).map(
            lambda t: f"if {t[0]} > {t[1]}:\n    {t[2]} = {t[3]}\nelse:\n    {t[4]} = {t[5]}"),
        st.tuples(name, e).map(lambda t: f"for v in lst:\n    if v > {t[1]}:\n        {t[0]} += 1"),
        st.tuples(name, e).map(lambda t: f"acc = []\nfor v in lst:\n    if v < {t[1]}:\n        acc.append(v)\n"
                                         f"{t[0]} = len(acc)"),
    )


PROGRAMS = st.lists(_stmt(), min_size=1, max_size=6).map(
    lambda body: "x0 = 0\nx1 = 0\nx2 = 0\n" + "\n".join(body) + "\nfinal_answer([x0, x1, x2])")
SMALL = st.integers(-3, 3)


def _outputs(program: str, values: dict[str, Any]) -> list[tuple[Any, frozenset[str]]] | None:
    env = {k: tag(v, lab(INPUTS[k])) for k, v in values.items()}
    interp = Interpreter(set(), _no_tools, env=env, max_operations=20_000)
    try:
        asyncio.run(interp.run(program))
    except ProgramError:
        return None
    assert interp.answer is not None
    return [(plain(x), deep_label(x).sources) for x in interp.answer.v]


async def _no_tools(name: str, args: dict[str, Value], pc: Label) -> Value:
    raise AssertionError("no tools here")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=PROGRAMS, a=SMALL, b=SMALL, c=SMALL, lst=st.lists(SMALL, min_size=1, max_size=4),
       which=st.sampled_from(sorted(INPUTS)), other=SMALL, other_list=st.lists(SMALL, min_size=1, max_size=4))
def test_an_output_that_an_input_changes_carries_that_inputs_source(
        program: str, a: int, b: int, c: int, lst: list[int], which: str, other: int, other_list: list[int]) -> None:
    values: dict[str, Any] = {"a": a, "b": b, "c": c, "lst": lst}
    changed = {**values, which: other_list if which == "lst" else other}
    assume(changed != values)
    first, second = _outputs(program, values), _outputs(program, changed)
    assume(first is not None and second is not None)
    assert first is not None and second is not None
    for (v1, sources1), (v2, sources2) in zip(first, second, strict=True):
        if v1 != v2:  # the input made a difference here: both runs must say it came from it
            assert INPUTS[which] in sources1 and INPUTS[which] in sources2, (program, which, v1, v2)
