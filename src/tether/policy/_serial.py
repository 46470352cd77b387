"""Versioned JSON for state dataclasses, generated from their fields (one generic pair of functions).

`dump_state(obj, version)` turns a dataclass into JSON-safe data by its field types (sets sorted, so
equal states dump equal), adding `"version"`; `load_state(cls, data, version)` validates the data back
into `cls`, refusing another version or a malformed field with one clear error. A field whose type
keeps its own form declares it with `Annotated[T, Codec(dump, load)]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from pydantic import PlainSerializer, PlainValidator, TypeAdapter, ValidationError

from tether._errors import InvalidInput

T = TypeVar("T")


def Codec(dump: Callable[[Any], Any], load: Callable[[Any], Any]) -> tuple[PlainValidator, PlainSerializer]:
    """Field metadata for a type that has its own JSON form: `Annotated[Provenance, *Codec(dump, load)]`
    (the validator first: a serializer before it would be replaced by the inner type's)."""
    return PlainValidator(load), PlainSerializer(dump, return_type=Any)


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def dump_state(obj: Any, version: int) -> dict[str, Any]:
    """`obj` (a dataclass instance) as JSON-safe data, with its format's `version`."""
    data: dict[str, Any] = _adapter(type(obj)).dump_python(obj, mode="json")
    return {"version": version, **data}


def load_state(cls: type[T], data: Any, version: int) -> T:
    """A `cls` from `dump_state` output of the same `version` (another version, or data that does not
    fit the fields, is refused: InvalidInput)."""
    found = data.get("version") if isinstance(data, dict) else None
    if found != version:
        raise InvalidInput(f"{_name(cls)} version {found!r} is not supported (expected {version})")
    fields = {k: v for k, v in data.items() if k != "version"}  # pyright: ignore[reportUnknownVariableType]
    try:
        return cast(T, _adapter(cls).validate_python(fields))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise InvalidInput(f"{_name(cls)} does not load: {where}: {first['msg']}") from None


def _name(cls: type[Any]) -> str:
    return "policy state" if cls.__name__ == "PolicyState" else cls.__name__
