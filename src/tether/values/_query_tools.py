"""The tools an agent with hidden values gets besides its own: the query tool and call_if."""

from __future__ import annotations

from collections.abc import Sequence

from tether.models._base import Model
from tether.tools._base import Tool
from tether.values._conditional import CONDITIONAL_TOOL, conditional_tool
from tether.values._declare import hides
from tether.values._query import QUERY_TOOL, query_tool


def with_query_tool(tools: Sequence[Tool], policy: object, model: Model) -> list[Tool]:
    """`tools`, plus the query tool (and call_if, with `SafetyPolicy(conditional_calls=True)`, the default)
    when the policy hides values and one of the tools may hide its output (answering with the policy's
    `query_model`, else `model`). A tool that may read a secret-bearing source (the policy's
    `may_read_secrets`: a Read of `.env`, a Bash `cat .env` hide whatever the tool) brings the query only."""
    if not getattr(policy, "hidden_values", False) or any(t.name == QUERY_TOOL for t in tools):
        return list(tools)
    hiding = any(hides(t) for t in tools)
    reads = getattr(policy, "may_read_secrets", None)
    if not hiding and not (callable(reads) and any(reads(t) for t in tools)):
        return list(tools)
    reader = getattr(policy, "query_model", None) or model
    extra = [query_tool(reader)]
    if hiding and getattr(policy, "conditional_calls", False) and not any(t.name == CONDITIONAL_TOOL for t in tools):
        extra.append(conditional_tool(reader))  # call_if (tether.values._conditional)
    return [*tools, *extra]
