"""`DeclarationGuard`: a tool's declarations that cannot be meant as written refuse its calls."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from tether._types import CallDecision
from tether.policy._capabilities import Capability
from tether.policy._guard import BaseGuard, CallView, Check, Stop
from tether.tools._base import Tool

if TYPE_CHECKING:
    from tether.policy._policy import SafetyPolicy


class DeclarationGuard(BaseGuard):
    """Declarations that name arguments the tool lacks, or contradict each other: the policy cannot
    know what they meant, so every call of such a tool is refused (`refused:declaration`, fail
    closed). Found once per tool; in the plan only for such a tool."""

    def prepare(self, policy: SafetyPolicy, tool: Tool, cap: Capability) -> Check | None:
        problem = declaration_problem(tool, cap)
        return None if problem is None else functools.partial(self.refuse, problem)

    def refuse(self, problem: str, c: CallView, /) -> Stop:
        return Stop(f"{CallDecision.REFUSED}:declaration", problem)

    def check(self, c: CallView, /) -> Stop | None:
        problem = declaration_problem(c.tool, c.cap)
        return None if problem is None else self.refuse(problem, c)


def _params(tool: Tool) -> set[str] | None:
    """The tool's declared parameter names (None: the schema takes any)."""
    props = tool.parameters.get("properties")
    if not isinstance(props, dict) or tool.parameters.get("additionalProperties") is True:
        return None
    return set(props)  # pyright: ignore[reportUnknownArgumentType]


def declaration_problem(tool: Tool, cap: Capability) -> str | None:
    """Declarations that name arguments the tool does not have, or contradict each other: the
    policy cannot know what they meant, so the call is refused (fail closed)."""
    names = _params(tool)
    d = tool.declared
    risk_free = cap.risk_free_args if cap.risk_free_args is not None else d.risk_free_args
    declared = {"guarded_args": cap.guarded_args, "risk_free_args": risk_free, "url_args": cap.url_args or d.url_args}
    for what, value in declared.items():
        if value is not None and (isinstance(value, str) or not all(isinstance(v, str) for v in value)):
            return f"'{tool.name}' declares {what} as {value!r}; it must be a list of argument names"
    if names is not None:
        for what, value in declared.items():
            unknown = sorted(set(value or ()) - names)
            if unknown:
                return (f"'{tool.name}' declares {what} {unknown} that it does not take (its arguments: "
                        f"{', '.join(sorted(names)) or 'none'}); fix the declaration")
    overlap = set(risk_free or ()) & set(cap.url_args or d.url_args or ())
    if overlap or (risk_free is not None and cap.guarded_args is not None
                   and set(risk_free) & set(cap.guarded_args)):
        return f"'{tool.name}' declares arguments both risk-free and checked; fix the declaration"
    return None
