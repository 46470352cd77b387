"""Capabilities: what a run may do with each tool (effect, ceilings, rate limits, approval)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from tether._errors import InvalidInput
from tether._types import Effect
from tether.policy._authz import check_tool
from tether.policy._canonical import get_path
from tether.tools._base import Tool

OnUntrusted = Literal["approve", "refuse", "summarize"]
EffectSpec = Effect | str | Callable[[dict[str, Any]], Effect | str]
AuthorizeFn = Callable[[str | None, dict[str, Any]], bool | str | None]


@dataclass(slots=True)
class Capability:
    """One tool as a run may use it.

    - `effect`: the effect class, or a function of the arguments (e.g. `send_money` with amount 0 is
      reversible, 500 irreversible); None keeps the tool's own `effect`.
    - `ceilings`: argument path -> maximum numeric value (`{"amount_usd": 50}`).
    - `per_run` / `per_user`: most calls in one run / by one user within `per_user_window` seconds.
    - `requires_approval`: always ask, tainted or not.
    - `on_untrusted`: what happens to an irreversible call, after taint, whose arguments are not all
      traceable to the user: ask for `approve`al, `refuse` it, or `summarize` it for the user.
    - `risk_free_args`: after taint every argument of a call with an effect (reversible or
      irreversible) must be traceable to the user, except these: payload the user asked to be
      derived from what was read (subject, body, title). None: every argument is checked. Links,
      host names, private data and secrets are looked for in risk-free arguments too.
    - `guarded_args`: the older, inverse declaration (the arguments the taint rule checks; the others
      are risk-free). A call whose checked arguments are all empty is checked in full.
    - `url_args`: arguments holding URLs the tool fetches or posts to (checked against egress).
    - `authorize`: `(user, args) -> True | False | reason` permission check for the acting user.
    """

    tool: str
    effect: EffectSpec | None = None
    ceilings: dict[str, float] = field(default_factory=dict)
    per_run: int | None = None
    per_user: int | None = None
    per_user_window: float = 86_400.0
    requires_approval: bool = False
    on_untrusted: OnUntrusted = "approve"
    risk_free_args: tuple[str, ...] | None = None
    guarded_args: tuple[str, ...] | None = None
    url_args: tuple[str, ...] = ()
    authorize: AuthorizeFn | None = None

    def __post_init__(self) -> None:
        if self.on_untrusted not in ("approve", "refuse", "summarize"):
            raise InvalidInput(f"Capability({self.tool!r}).on_untrusted must be approve, refuse or summarize, "
                             f"got {self.on_untrusted!r}")
        for name in ("per_run", "per_user"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidInput(f"Capability({self.tool!r}).{name} must be >= 0")

    def effect_for(self, tool: Tool, args: dict[str, Any]) -> Effect:
        """The effect class of this call (may depend on its arguments)."""
        spec = self.effect if self.effect is not None else tool.effect
        if isinstance(spec, Effect):  # the usual case; Effect(spec) would only hand it back
            return spec
        if callable(spec) and not isinstance(spec, str):
            spec = spec(args)
        return Effect(spec)

    def ceiling_violations(self, args: dict[str, Any]) -> list[str]:
        """Human-readable reasons for every ceiling this call exceeds."""
        out = []
        for path, limit in self.ceilings.items():
            found, value = get_path(args, path)
            if not found or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                try:
                    value = float(value)
                except (TypeError, ValueError, OverflowError):
                    out.append(f"{path}={_short(value)} is not a number (ceiling {limit:g})")
                    continue
            # NaN compares false with everything, so it would pass any ceiling: refuse non-finite values
            if isinstance(value, float) and not math.isfinite(value):
                out.append(f"{path}={value!r} is not a finite number (ceiling {limit:g})")
            elif value > limit:
                out.append(f"{path}={_short(value)} exceeds the ceiling of {limit:g}")
        return out

    @classmethod
    def from_tool(cls, tool: Tool) -> Capability:
        """Defaults from the tool itself: its effect and its declarations of the same names (`Declares`)."""
        d = tool.declared
        return cls(
            tool=tool.name,
            effect=d.effect_of,
            ceilings=dict(d.ceilings),
            per_run=d.per_run,
            per_user=d.per_user,
            requires_approval=bool(d.requires_approval),
            on_untrusted=d.on_untrusted,
            risk_free_args=_names(d.risk_free_args),
            guarded_args=_names(d.guarded_args),
            url_args=tuple(d.url_args),
            authorize=d.authorize,
        )


def _names(value: Any) -> Any:
    """A declared list of argument names as a tuple; anything else (a lone string) is kept as it
    is, so the policy refuses the tool's calls with a clear reason rather than guess."""
    if value is None or isinstance(value, str):
        return value
    try:
        return tuple(value)
    except TypeError:
        return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Capabilities:
    """The capabilities of a run. Tools not listed are refused, unless `unlisted="inherit"`, which
    derives a capability from the tool (`Capability.from_tool`)."""

    def __init__(self, caps: Iterable[Capability] = (), *, unlisted: Literal["deny", "inherit"] = "deny") -> None:
        self.caps: dict[str, Capability] = {}
        for cap in caps:
            if cap.tool in self.caps:
                raise InvalidInput(f"two capabilities for tool {cap.tool!r}")
            self.caps[cap.tool] = cap
        if unlisted not in ("deny", "inherit"):
            raise InvalidInput(f"unlisted must be 'deny' or 'inherit', got {unlisted!r}")
        self.unlisted = unlisted
        self._derived: dict[str, Capability] = {}

    def refusal(self, tool: Tool, args: dict[str, Any], user: str | None) -> str | None:
        """Why a sub-agent's call is outside these capabilities (a delegating run's): the tool is not
        permitted, an argument is over a ceiling, or the acting user may not make it; None if inside."""
        cap = self.get(tool)
        if cap is None:
            return f"'{tool.name}' is not permitted in the task that delegated this one"
        over = cap.ceiling_violations(args)
        if over:
            return "over the delegating task's ceiling: " + "; ".join(over)
        return check_tool(cap.authorize, user, tool, args)

    def requires_approval(self, tool: Tool) -> bool:
        """Whether a call of `tool` always needs a person's approval under these capabilities."""
        cap = self.get(tool)
        return cap is not None and cap.requires_approval

    def get(self, tool: Tool) -> Capability | None:
        cap = self.caps.get(tool.name)
        if cap is not None:
            return cap
        if self.unlisted == "deny":
            return None
        derived = self._derived.get(tool.name)
        if derived is None:
            derived = self._derived[tool.name] = Capability.from_tool(tool)
        return derived
