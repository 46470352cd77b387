"""Authorization: a run acts as a user; a call runs only if that user may make it.

Two layers, both optional: an `Authorizer` for the whole deployment (e.g. a permission table), and
a per-tool check (`Capability.authorize` or `@tool(authorize=...)`, a function of
`(user, args)`), e.g. `restart_service` only for services owned by the user's team. A denial is a
reason string the model sees as an error; it never raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from tether.tools._base import Tool


class Authorizer(Protocol):
    def authorize(self, user: str | None, tool: Tool, args: dict[str, Any]) -> str | None:
        """None when allowed, else the reason for the denial."""
        ...


class Permissions:
    """A permission table: user -> grants. A grant is a tool name, `"*"` (every tool), or
    `"effect:read_only"` (every tool whose declared effect is read-only). Unknown users get nothing
    unless `anonymous` grants are given (used when a run has no user)."""

    def __init__(self, grants: Mapping[str, Iterable[str]], *, anonymous: Iterable[str] = ()) -> None:
        self.grants = {user: frozenset(g) for user, g in grants.items()}
        self.anonymous = frozenset(anonymous)

    def authorize(self, user: str | None, tool: Tool, args: dict[str, Any]) -> str | None:
        granted = self.anonymous if user is None else self.grants.get(user, frozenset())
        if "*" in granted or tool.name in granted or f"effect:{tool.effect.value}" in granted:
            return None
        who = "an anonymous run" if user is None else f"user {user!r}"
        return f"{who} is not permitted to use '{tool.name}'"


def check_tool(fn: Any, user: str | None, tool: Tool, args: dict[str, Any]) -> str | None:
    """Run a per-tool check `(user, args) -> True | False | reason | None` and normalise it."""
    if fn is None:
        return None
    try:
        out = fn(user, args)
    except Exception as exc:  # a broken check denies, it does not crash the run
        return f"permission check for '{tool.name}' failed ({type(exc).__name__}: {exc}); denied"
    if out is True or out is None:
        return None
    if out is False:
        who = "this run's user" if user is None else f"user {user!r}"
        return f"{who} is not permitted to make this '{tool.name}' call"
    return str(out)
