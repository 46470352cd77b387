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
    Two keys with the same name name the same value; `value_type` is for the type checker only. A key
    is always yours: one named as tether's old names ("result_handles") never reaches `RunFacts`."""

    __slots__ = ("name", "value_type")

    def __init__(self, name: str, value_type: type[T] | None = None) -> None:
        if not isinstance(cast("object", name), str) or not name:  # (the annotation binds no caller)
            raise InvalidType(f"an ExtraKey's name is a non-empty str (such as 'myapp.tenant'), not {name!r}")
        self.name = name
        self.value_type = value_type

    def __repr__(self) -> str:
        return f"ExtraKey({self.name!r})"


class Extras:
    """The caller's own values on a call, by `ExtraKey` (`CallContext.extra`, `ToolContext.extra`).

    Reads and writes like a dict keyed by `ExtraKey`s: `extras[KEY]`, `extras.get(KEY, default)`,
    `extras[KEY] = value`, `extras.setdefault(KEY, value)`, `extras.pop(KEY, default)`, `KEY in extras`.
    A key of any other type is refused (`InvalidType`). A plain string key still works, deprecated (a
    `DeprecationWarning` each use, removed in `REMOVED_IN`); tether's own old names among them read and
    write the `RunFacts` of the run the extras are read through.
    """

    __slots__ = ("_early", "_facts", "_values")

    def __init__(self, values: Mapping[ExtraKey[Any], Any] | None = None) -> None:
        self._values: dict[str, Any] = {}
        self._facts: RunFacts | None = None
        self._early: dict[str, Any] = {}  # RunFacts field -> value, given by an old name before a run was bound
        for key, value in (values or {}).items():
            self[key] = value

    @classmethod
    def from_legacy(cls, values: Mapping[str, Any], facts: RunFacts, owner: str) -> Extras:
        """The old form, a `dict[str, Any]` given as `extra=`: tether's own names set `facts`, the rest
        become values (with one `DeprecationWarning`)."""
        _deprecated(f"{owner}(extra={{...}}) with a dict", "extra=Extras({ExtraKey(name, value_type): value})")
        out = cls()
        out._facts = facts
        for name, value in cast("Mapping[object, Any]", values).items():  # (a caller's keys may be anything)
            if not isinstance(name, str):
                raise _not_a_key(name)
            out._set(name, LEGACY_NAMES.get(name), value)
        return out

    def bind(self, facts: RunFacts) -> Extras:
        """These values as seen from the run whose facts are `facts` (where the deprecated string keys
        for tether's own facts read and write): itself, first bound now, or, when another run's facts
        are bound already, a view sharing its values (each run's facts stay its own)."""
        if self._facts is facts:
            return self
        if self._facts is None:
            self._facts = facts
            for attr, value in self._early.items():
                setattr(facts, attr, value)
            self._early.clear()
            return self
        view = Extras()
        view._values, view._facts = self._values, facts
        return view

    # -- typed access ----------------------------------------------------------------------------------

    @overload
    def __getitem__(self, key: ExtraKey[T]) -> T: ...
    @overload
    def __getitem__(self, key: str) -> Any: ...

    def __getitem__(self, key: ExtraKey[Any] | str) -> Any:
        found = self._get(*self._key(key), _MISSING)
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
        return self._get(*self._key(key), default)

    @overload
    def __setitem__(self, key: ExtraKey[T], value: T) -> None: ...
    @overload
    def __setitem__(self, key: str, value: Any) -> None: ...

    def __setitem__(self, key: ExtraKey[Any] | str, value: Any) -> None:
        self._set(*self._key(key), value)

    @overload
    def setdefault(self, key: ExtraKey[T], default: T) -> T: ...
    @overload
    def setdefault(self, key: str, default: Any) -> Any: ...

    def setdefault(self, key: ExtraKey[Any] | str, default: Any) -> Any:
        name, attr = self._key(key)
        found = self._get(name, attr, None)
        if found is None:
            self._set(name, attr, found := default)
        return found

    @overload
    def pop(self, key: ExtraKey[T]) -> T: ...
    @overload
    def pop(self, key: ExtraKey[T], default: D) -> T | D: ...
    @overload
    def pop(self, key: str, default: Any = ...) -> Any: ...

    def pop(self, key: ExtraKey[Any] | str, default: Any = ...) -> Any:
        name, attr = self._key(key)
        if attr is not None:
            if self._facts is not None:
                raise InvalidType(f"tether's own '{name}' cannot be removed (it is RunFacts.{attr})")
            values, name = self._early, attr
        else:
            values = self._values
        if default is ...:
            if name not in values:
                raise MissingKey(f"no value under {key!r} on this call")
            return values.pop(name)
        return values.pop(name, default)

    def __delitem__(self, key: ExtraKey[Any] | str) -> None:
        self.pop(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, ExtraKey):
            return key.name in self._values
        return isinstance(key, str) and self._get(*self._key(key), None) is not None

    def __iter__(self) -> Iterator[str]:
        """The names of the values set (not tether's own facts)."""
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __bool__(self) -> bool:
        return bool(self._values)

    def __repr__(self) -> str:
        return f"Extras({self._values!r})"

    # -- the one place keys are resolved -----------------------------------------------------------------

    def _key(self, key: object) -> tuple[str, str | None]:
        """The value's name, and the `RunFacts` field it is when it is a string key of tether's old names
        (an `ExtraKey` is always the caller's own value, whatever its name)."""
        if isinstance(key, ExtraKey):
            return key.name, None
        if not isinstance(key, str):
            raise _not_a_key(key)
        attr = LEGACY_NAMES.get(key)
        if attr is not None:
            _deprecated(f"CallContext.extra[{key!r}]", f"the typed field ctx.run.{attr}")
        else:
            _deprecated(f"CallContext.extra with a string key ({key!r})", f"an ExtraKey: ExtraKey({key!r}, value_type)")
        return key, attr

    def _get(self, name: str, attr: str | None, default: Any) -> Any:
        if attr is None:
            return self._values.get(name, default)
        if self._facts is None:
            return self._early.get(attr, default)
        value = getattr(self._facts, attr)
        return default if value is None else value

    def _set(self, name: str, attr: str | None, value: Any) -> None:
        if attr is None:
            self._values[name] = value
        elif self._facts is None:
            self._early[attr] = value
        else:
            setattr(self._facts, attr, value)


_MISSING: Any = object()


def _not_a_key(key: object) -> InvalidType:
    return InvalidType(f"an extra's key is an ExtraKey (ExtraKey('myapp.name', value_type)), not a "
                       f"{type(key).__name__}: {key!r}")


def bound_extras(extra: object, facts: RunFacts, owner: str) -> Extras:
    """A context's `extra` bound to its run's facts; the old form, a dict, converted (deprecated)."""
    if isinstance(extra, Extras):
        return extra.bind(facts)
    return Extras.from_legacy(cast("Mapping[str, Any]", extra), facts, owner)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated and is removed in tether {REMOVED_IN}; use {new}",
                  DeprecationWarning, stacklevel=user_stacklevel())

