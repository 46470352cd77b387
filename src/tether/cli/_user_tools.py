"""`--tools module:attr`: the user's own Python tools on the command line (and in durable runs,
which rebuild them from the same text in whichever process recovers the run)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from tether._errors import TetherError
from tether.tools._base import Tool, tool


class ToolImportError(TetherError, ValueError):
    """A `module:attr` tool reference that cannot be loaded; the message says why."""


def is_reference(name: str) -> bool:
    return ":" in name


def import_tools(ref: str) -> list[Tool]:
    """The tools `module:attr` names: a `Tool`, a typed function (made a tool from its signature;
    declare its effect with `@tool(effect=...)`), or a list or tuple of them. The working
    directory is importable, as for `python -m`. A tool that takes a `ToolContext` parameter gets
    the call's `idempotency_key`, the same when a recovered durable run repeats the call."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ToolImportError(f"--tools {ref}: write a tool reference as module:name (e.g. mytools:refund)")
    # the working directory is importable while the user's module is imported, and only then: a module
    # there named like an optional dependency is never picked up by tether's own later imports
    added = os.getcwd() not in sys.path
    if added:
        sys.path.append(os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any failure is theirs to read
        raise ToolImportError(f"--tools {ref}: cannot import {module_name} ({type(exc).__name__}: {exc})") from exc
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(os.getcwd())
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ToolImportError(f"--tools {ref}: {module_name} has no {attr}")
        obj = getattr(obj, part)
    items = list(obj) if isinstance(obj, list | tuple) else [obj]
    out: list[Tool] = []
    for item in items:
        if isinstance(item, Tool):
            out.append(item)
        elif callable(item):
            try:
                out.append(tool(item))
            except Exception as exc:
                raise ToolImportError(f"--tools {ref}: {getattr(item, '__name__', item)} cannot be a tool ({exc})") from exc
        else:
            raise ToolImportError(f"--tools {ref}: {type(item).__name__} is not a tool, a function or a list of them")
    if not out:
        raise ToolImportError(f"--tools {ref}: the list is empty")
    return out
