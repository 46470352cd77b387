"""`CallContext.extra` is typed (tether issue 38): tether's own facts are `RunFacts` fields, the caller's
values sit under `ExtraKey`s, and the old dict form still works with a DeprecationWarning."""

from __future__ import annotations

import asyncio
import dataclasses
import warnings
from collections.abc import Callable

import pytest

from tether import CallContext, ExtraKey, Extras, ToolContext, tool
from tether._errors import InvalidType, MissingKey
from tether._types import ToolCall
from tether.tools import Executor, RunFacts
from tether.tools._extra import LEGACY_NAMES

TENANT = ExtraKey("myapp.tenant", str)
LIMIT = ExtraKey("myapp.limit", int)


def test_typed_keys_read_and_write_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx = CallContext("r", extra=Extras({TENANT: "acme"}))
        assert ctx.extra[TENANT] == "acme" and ctx.extra.get(LIMIT) is None and ctx.extra.get(LIMIT, 3) == 3
        ctx.extra[LIMIT] = 5
        assert ctx.extra.setdefault(LIMIT, 9) == 5 and LIMIT in ctx.extra and list(ctx.extra) == [TENANT.name,
                                                                                                   LIMIT.name]
        assert ctx.extra.pop(LIMIT) == 5 and LIMIT not in ctx.extra and len(ctx.extra) == 1
        assert ExtraKey("myapp.tenant", str) in ctx.extra  # a key is its name
        with pytest.raises(MissingKey):
            ctx.extra[LIMIT]


def test_a_tool_sees_the_callers_values_and_the_runs_facts() -> None:
    seen: list[object] = []

    @tool
    def who(context: ToolContext) -> str:
        """Who is calling."""
        seen.extend([context.extra.get(TENANT), context.run.handles])
        return "ok"

    ctx = CallContext("r", extra=Extras({TENANT: "acme"}), run=RunFacts(handles={"r_1"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = asyncio.run(Executor([who]).execute(ToolCall("c1", "who", {}), ctx))
    assert not result.is_error and seen == ["acme", {"r_1"}]


def test_the_old_dict_form_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"CallContext\(extra=\{\.\.\.\}\) with a dict.*ExtraKey"):
        ctx = CallContext("r", extra={"tenant": "acme", "result_handles": {"r_1"}})
    assert ctx.run.handles == {"r_1"}  # tether's own old name lands in its typed field
    with pytest.warns(DeprecationWarning, match=r"string key \('tenant'\).*ExtraKey\('tenant', value_type\)"):
        assert ctx.extra["tenant"] == "acme"
    assert ctx.extra.get(ExtraKey("tenant", str)) == "acme"  # the same value under a typed key of that name
    with pytest.warns(DeprecationWarning, match=r"extra\['result_handles'\].*ctx\.run\.handles"):
        ctx.extra.setdefault("result_handles", set()).add("r_2")
    assert ctx.run.handles == {"r_1", "r_2"}
    with pytest.warns(DeprecationWarning, match="ToolContext"):
        assert ToolContext("r", "c", extra={"tenant": "x"}).extra.get(ExtraKey("tenant", str)) == "x"


@pytest.mark.parametrize("bad", [5, 2.5, ("myapp", "tenant"), None, str])
def test_a_key_that_is_not_an_extra_key_is_refused_with_one_clear_error(bad: object) -> None:
    extras = Extras()
    for use in (lambda: extras.__setitem__(bad, "x"), lambda: extras[bad], lambda: extras.get(bad),  # type: ignore[index]
                lambda: extras.setdefault(bad, "x"), lambda: extras.pop(bad, None), lambda: Extras({bad: "x"})):  # type: ignore[arg-type]
        with pytest.raises(InvalidType, match=r"is an ExtraKey \(ExtraKey\('myapp\.name', value_type\)\), not .*"
                                              + type(bad).__name__):
            use()
    assert len(extras) == 0
    with pytest.raises(InvalidType, match="name is a non-empty str"):
        ExtraKey(5, str)  # type: ignore[arg-type]
    with pytest.raises(InvalidType, match="name is a non-empty str"):
        ExtraKey("", str)


FACTS = sorted(LEGACY_NAMES)


def _facts(run: RunFacts) -> dict[str, object]:
    return {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}


@pytest.mark.parametrize("name", FACTS)
def test_a_users_key_never_reads_or_writes_tethers_facts(name: str) -> None:
    """An `ExtraKey` named as one of tether's old names (`result_handles`, `tether.jobs`, ...) is the
    user's own value: tether's facts neither show through it nor change under it."""
    mine = ExtraKey(name, str)
    ctx = CallContext("r", run=RunFacts(user_messages=["hi"], handles={"r_1"}))
    before = _facts(ctx.run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ctx.extra.get(mine) is None and mine not in ctx.extra
        ctx.extra[mine] = "the user's"
        assert ctx.extra[mine] == "the user's" and ctx.extra.setdefault(mine, "other") == "the user's"
        assert _facts(ctx.run) == before and list(ctx.extra) == [name]
        assert ctx.extra.pop(mine) == "the user's" and _facts(ctx.run) == before and mine not in ctx.extra
        given = CallContext("r2", extra=Extras({mine: "given"}), run=RunFacts(handles={"r2_1"}))
        assert given.run.handles == {"r2_1"} and given.extra[mine] == "given"
        assert _facts(given.run) == _facts(RunFacts(handles={"r2_1"}))


def _one_warning(use: Callable[[], object]) -> object:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = use()
    assert [w.category for w in caught] == [DeprecationWarning], [str(w.message) for w in caught]
    assert "removed in tether 0.3.0" in str(caught[0].message)
    return out


def test_each_deprecated_use_warns_once_and_still_works() -> None:
    ctx = CallContext("r", run=RunFacts(handles={"r_1"}))
    _one_warning(lambda: ctx.extra.__setitem__("tenant", "acme"))
    assert _one_warning(lambda: ctx.extra["tenant"]) == "acme"
    assert _one_warning(lambda: "tenant" in ctx.extra) is True
    assert _one_warning(lambda: ctx.extra.get("tenant")) == "acme"
    assert _one_warning(lambda: ctx.extra.setdefault("tenant", "x")) == "acme"
    assert _one_warning(lambda: ctx.extra.pop("tenant")) == "acme" and TENANT not in ctx.extra
    # tether's old names: the run's typed facts, read and written
    assert _one_warning(lambda: ctx.extra["result_handles"]) == {"r_1"}
    _one_warning(lambda: ctx.extra.__setitem__("user_messages", ["hello"]))
    assert ctx.run.user_messages == ["hello"]
    assert _one_warning(lambda: "tether.jobs" in ctx.extra) is False  # no jobs in this run
    with pytest.raises(InvalidType, match=r"tether's own 'result_handles' cannot be removed"):
        _one_warning(lambda: ctx.extra.pop("result_handles"))
    # the old dict form: one warning for the dict, whatever it holds
    old = _one_warning(lambda: CallContext("r", extra={"tenant": "a", "result_handles": {"h"}, "tether.parent": None}))
    assert isinstance(old, CallContext) and old.run.handles == {"h"}
    # an old name given to Extras before any run is bound: it lands in the run's facts, not in the values
    early = _one_warning(lambda: Extras({"result_handles": {"e_1"}}))  # type: ignore[dict-item]
    assert isinstance(early, Extras)
    bound = CallContext("r", extra=early)
    assert bound.run.handles == {"e_1"} and list(bound.extra) == [] and ExtraKey("result_handles") not in bound.extra


def test_a_sub_agents_calls_carry_its_own_runs_facts_and_none_of_the_parents_extras() -> None:
    """docs/safety.md: a sub-agent's run is a run of its own: its calls see its handles, jobs and parent,
    and an empty `extra` (the values of the call that started it are not passed down)."""
    from tether import Agent, AllowAll
    from tether.models._scripted import ScriptedModel, call

    seen: list[tuple[object, object, object]] = []

    @tool
    def probe(context: ToolContext) -> str:
        """Look at the call's context."""
        seen.append((context.extra.get(TENANT), context.run.handles, context.run.parent))
        return "probed"

    child = Agent(ScriptedModel([call("probe"), "done"]), tools=[probe], policy=AllowAll())
    parent_facts = RunFacts(handles={"p_1"})
    ctx = CallContext("p", extra=Extras({TENANT: "acme"}), run=parent_facts)
    result = asyncio.run(Executor([child.as_tool("helper")]).execute(ToolCall("c1", "helper", {"task": "probe"}), ctx))
    assert not result.is_error, result.content
    [(tenant, handles, parent)] = seen
    assert tenant is None and handles == set() and handles is not parent_facts.handles
    assert parent is not None and parent is not parent_facts.parent  # the sub-agent's own run, for its own children
    assert ctx.extra[TENANT] == "acme" and parent_facts.handles == {"p_1"}


def test_run_facts_survive_copies_of_a_context_and_one_extras_shared_by_two_runs() -> None:
    """A copy of a call's context (`dataclasses.replace`: the executor's jobs, plan mode's steps) is the
    same run: its facts are the run's. One `Extras` given to two runs' contexts keeps each run's facts its
    own (tether's old names read the run they are read through)."""
    ctx = CallContext("r", extra=Extras({TENANT: "acme"}), run=RunFacts(handles={"r_1"}))
    step = dataclasses.replace(ctx, step=3)
    assert step.run is ctx.run and step.extra[TENANT] == "acme"
    step.run.handles.add("r_2")  # type: ignore[union-attr]
    assert ctx.run.handles == {"r_1", "r_2"}
    with pytest.warns(DeprecationWarning):
        assert step.extra["result_handles"] is ctx.run.handles
    shared = Extras({TENANT: "acme"})
    a = CallContext("a", extra=shared, run=RunFacts(handles={"a_1"}))
    b = CallContext("b", extra=shared, run=RunFacts(handles={"b_1"}))
    with pytest.warns(DeprecationWarning):
        assert a.extra["result_handles"] == {"a_1"}
    with pytest.warns(DeprecationWarning):
        assert b.extra["result_handles"] == {"b_1"}
    a.extra[LIMIT] = 7  # the caller's values stay one set, shared as given
    assert b.extra[LIMIT] == 7 and shared[LIMIT] == 7
    moved = dataclasses.replace(a, run=RunFacts(handles={"m_1"}))
    with pytest.warns(DeprecationWarning):
        assert a.extra["result_handles"] == {"a_1"} and moved.extra["result_handles"] == {"m_1"}
