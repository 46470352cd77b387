"""What rides on a call besides its arguments: `RunFacts`, tether's own per-run facts (typed fields),
and `Extras`, the caller's own values under typed keys (`ExtraKey`).

Both reach a policy as `CallContext.run` / `CallContext.extra` and a tool as `ToolContext.run` /
`ToolContext.extra`. Before 0.2.0 both were one `dict[str, Any]` (`CallContext.extra`); string keys
still work, with a `DeprecationWarning`, until `REMOVED_IN` (tether's own names, such as
"result_handles", read and write the matching `RunFacts` field).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from tether._compat import REMOVED_IN, user_stacklevel
from tether._errors import InvalidType, MissingKey

if TYPE_CHECKING:
    from tether._loop import ParentRun
    from tether._types import Usage
    from tether.tools._jobs import Jobs

T = TypeVar("T")
D = TypeVar("D")


def _strings() -> list[str]:
    return []


def _batches() -> dict[str, dict[str, Any]]:
    return {}


@dataclass(slots=True)
class RunFacts:
    """tether's own facts about the run a call belongs to (set by the loop, the MCP server, ...).

    - `user_messages`, `history_tool_outputs`: the user's own words and earlier turns' tool outputs,
      read once per run for the policy's provenance.
    - `handles`: the capped-result handles the run owns (`read_result` reads only these); None
      outside a run, where no handle is readable.
    - `parent`: the running agent, for a sub-agent one of its tools starts (`tether._loop.ParentRun`).
    - `jobs`: the run's background jobs, when the agent has a job tool.
    - `batch_decided`: call id -> the decision on a batch an earlier call of it was asked with.
    - `budget_offer`, `usage_sink`: over tether's MCP server, the budget a calling agent offered
      (max tokens, max cost; None for no limit) and the `Usage` its sub-agent's spending is added to.
    """

    user_messages: list[str] = field(default_factory=_strings)
    history_tool_outputs: list[str] = field(default_factory=_strings)
    handles: set[str] | None = None
    parent: ParentRun | None = None
    jobs: Jobs | None = None
    batch_decided: dict[str, dict[str, Any]] = field(default_factory=_batches)
    budget_offer: tuple[int | None, float | None] | None = None
    usage_sink: Usage | None = None


# The string keys tether used in the old `CallContext.extra` dict, and the `RunFacts` field each is now.
LEGACY_NAMES = {"user_messages": "user_messages", "history_tool_outputs": "history_tool_outputs",
                "result_handles": "handles", "tether.parent": "parent", "tether.jobs": "jobs",
                "tether.batch_decided": "batch_decided", "tether/budget_offer": "budget_offer",
                "tether/usage_sink": "usage_sink"}


class ExtraKey(Generic[T]):
    """A typed key for a value of your own on every call of a run: `TENANT = ExtraKey("myapp.tenant", str)`,
    then `CallContext(run_id, extra=Extras({TENANT: "acme"}))`, and a policy or tool reads
    `ctx.extra[TENANT]` (a `str` to every type checker) or `ctx.extra.get(TENANT)` (`str | None`).
    Two keys with the same name name the same value; `value_type` is for the type checker only."""

    __slots__ = ("name", "value_type")

    def __init__(self, name: str, value_type: type[T] | None = None) -> None:
        self.name = name
        self.value_type = value_type

    def __repr__(self) -> str:
        return f"ExtraKey({self.name!r})"


class Extras:
    """The caller's own values on a call, by `ExtraKey` (`CallContext.extra`, `ToolContext.extra`).

    Reads and writes like a dict keyed by `ExtraKey`s: `extras[KEY]`, `extras.get(KEY, default)`,
    `extras[KEY] = value`, `extras.setdefault(KEY, value)`, `extras.pop(KEY, default)`, `KEY in extras`.
    A plain string key still works, deprecated (a `DeprecationWarning`, removed in `REMOVED_IN`);
    tether's own old names among them read and write the run's `RunFacts`.
    """

    __slots__ = ("_facts", "_values")

    def __init__(self, values: Mapping[ExtraKey[Any], Any] | None = None) -> None:
        self._values: dict[str, Any] = {}
        self._facts: RunFacts | None = None
        for key, value in (values or {}).items():
            self[key] = value

    @classmethod
    def from_legacy(cls, values: Mapping[str, Any], facts: RunFacts, owner: str) -> Extras:
        """The old form, a `dict[str, Any]` given as `extra=`: tether's own names set `facts`, the rest
        become values (with one `DeprecationWarning`)."""
        _deprecated(f"{owner}(extra={{...}}) with a dict", "extra=Extras({ExtraKey(name, value_type): value})")
        out = cls()
        out._facts = facts
        for name, value in values.items():
            out._set(name, value)
        return out

    def bind(self, facts: RunFacts) -> None:
        """Where the deprecated string keys for tether's own facts read and write."""
        self._facts = facts

    # -- typed access ----------------------------------------------------------------------------------

    @overload
    def __getitem__(self, key: ExtraKey[T]) -> T: ...
    @overload
    def __getitem__(self, key: str) -> Any: ...

    def __getitem__(self, key: ExtraKey[Any] | str) -> Any:
        found = self._get(self._name(key), _MISSING)
        if found is _MISSING:
            raise MissingKey(f"no value under {key!r} on this call")
        return found

    @overload
    def get(self, key: ExtraKey[T]) -> T | None: ...
    @overload
    def get(self, key: ExtraKey[T], default: D) -> T | D: ...
    @overload
    def get(self, key: str, default: Any = None) -> Any: ...

    def get(self, key: ExtraKey[Any] | str, default: Any = None) -> Any:
        return self._get(self._name(key), default)

    @overload
    def __setitem__(self, key: ExtraKey[T], value: T) -> None: ...
    @overload
    def __setitem__(self, key: str, value: Any) -> None: ...

    def __setitem__(self, key: ExtraKey[Any] | str, value: Any) -> None:
        self._set(self._name(key), value)

    @overload
    def setdefault(self, key: ExtraKey[T], default: T) -> T: ...
    @overload
    def setdefault(self, key: str, default: Any) -> Any: ...

    def setdefault(self, key: ExtraKey[Any] | str, default: Any) -> Any:
        name = self._name(key)
        found = self._get(name, None)
        if found is None:
            self._set(name, found := default)
        return found

    @overload
    def pop(self, key: ExtraKey[T]) -> T: ...
    @overload
    def pop(self, key: ExtraKey[T], default: D) -> T | D: ...
    @overload
    def pop(self, key: str, default: Any = ...) -> Any: ...

    def pop(self, key: ExtraKey[Any] | str, default: Any = ...) -> Any:
        name = self._name(key)
        if name in LEGACY_NAMES and self._facts is not None:
            raise InvalidType(f"tether's own '{name}' cannot be removed (it is RunFacts.{LEGACY_NAMES[name]})")
        if default is ...:
            if name not in self._values:
                raise MissingKey(f"no value under {key!r} on this call")
            return self._values.pop(name)
        return self._values.pop(name, default)

    def __delitem__(self, key: ExtraKey[Any] | str) -> None:
        self.pop(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, ExtraKey):
            return self._get(key.name, _MISSING) is not _MISSING
        return isinstance(key, str) and self._get(self._name(key), None) is not None

    def __iter__(self) -> Iterator[str]:
        """The names of the values set (not tether's own facts)."""
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __bool__(self) -> bool:
        return bool(self._values)

    def __repr__(self) -> str:
        return f"Extras({self._values!r})"

    # -- the one place names are resolved ----------------------------------------------------------------

    def _name(self, key: ExtraKey[Any] | str) -> str:
        if isinstance(key, ExtraKey):
            return key.name
        if key in LEGACY_NAMES:
            _deprecated(f"CallContext.extra[{key!r}]", f"the typed field ctx.run.{LEGACY_NAMES[key]}")
        else:
            _deprecated(f"CallContext.extra with a string key ({key!r})", f"an ExtraKey: ExtraKey({key!r}, value_type)")
        return key

    def _get(self, name: str, default: Any) -> Any:
        if self._facts is not None and (attr := LEGACY_NAMES.get(name)) is not None:
            value = getattr(self._facts, attr)
            return default if value is None else value
        return self._values.get(name, default)

    def _set(self, name: str, value: Any) -> None:
        if self._facts is not None and (attr := LEGACY_NAMES.get(name)) is not None:
            setattr(self._facts, attr, value)
        else:
            self._values[name] = value


_MISSING: Any = object()


def bound_extras(extra: object, facts: RunFacts, owner: str) -> Extras:
    """A context's `extra` bound to its run's facts; the old form, a dict, converted (deprecated)."""
    if isinstance(extra, Extras):
        extra.bind(facts)
        return extra
    return Extras.from_legacy(cast("Mapping[str, Any]", extra), facts, owner)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated and is removed in tether {REMOVED_IN}; use {new}",
                  DeprecationWarning, stacklevel=user_stacklevel())

