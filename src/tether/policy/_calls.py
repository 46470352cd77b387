"""A call's arguments as plain JSON, and how it describes itself to a person (`describe`, `dry_run`)."""

from __future__ import annotations

import inspect
from typing import Any

from pydantic_core import to_jsonable_python

from tether.policy._canonical import canonical_json
from tether.tools._base import Tool

_SCALARS = frozenset({str, int, float, bool, type(None)})


def plain_args(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments as plain JSON values (models and dataclasses -> dicts, URLs, decimals, dates and
    enums -> their JSON form); JSON-native arguments come back equal."""
    for k, v in args.items():
        if type(k) is not str or type(v) not in _SCALARS:
            return {str(k): _plain(v) for k, v in args.items()}
    return dict(args)  # flat and JSON-native already (the usual case): a copy, as _plain would make


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    try:
        # a model's fields may themselves be models or URLs: convert, then walk what came out
        return _plain(to_jsonable_python(value, fallback=str))
    except Exception:  # e.g. lone surrogates in a model's string field
        return str(value)


async def _describe(tool: Tool, args: dict[str, Any]) -> str:
    fn = tool.declared.describe
    if callable(fn):
        try:
            out = fn(args)
            if inspect.isawaitable(out):
                out = await out
            return str(out)
        except Exception as exc:
            return f"{tool.name}({canonical_json(args)}) [describe failed: {type(exc).__name__}]"
    return f"{tool.name}({canonical_json(args)})"


async def _dry_run(tool: Tool, args: dict[str, Any]) -> str | None:
    fn = tool.declared.dry_run
    if not callable(fn):
        return None
    try:
        out = fn(args)
        if inspect.isawaitable(out):
            out = await out
        return None if out is None else str(out)
    except Exception as exc:
        return f"(dry run failed: {type(exc).__name__}: {exc})"
