"""`CallContext.extra` is typed (tether issue 38): tether's own facts are `RunFacts` fields, the caller's
values sit under `ExtraKey`s, and the old dict form still works with a DeprecationWarning."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from tether import CallContext, ExtraKey, Extras, ToolContext, tool
from tether._errors import MissingKey
from tether._types import ToolCall
from tether.tools import Executor, RunFacts

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
