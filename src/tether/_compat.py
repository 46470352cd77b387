"""Old import paths that still work, with a warning, for one minor version (see CHANGELOG.md).

tether's implementation modules were renamed to private ones (`tether.models.scripted` became
`tether.models._scripted`, `tether.agent` became `tether._agent`, ...). Importing an old path imports
the module under its new name and warns once, pointing at the public entry point to use instead; the
aliases go in `REMOVED_IN`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import FrameType, ModuleType

REMOVED_IN = "0.3.0"


class RenamedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `tether.a.b` as the module `tether.a._b`, when only the latter exists (asked last, after
    every real finder failed)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        head, _, last = fullname.rpartition(".")
        if not head or not fullname.startswith("tether.") or last.startswith("_"):
            return None
        try:
            found = importlib.util.find_spec(f"{head}._{last}")
        except (ImportError, ValueError):
            return None
        return None if found is None else importlib.util.spec_from_loader(fullname, self, origin=found.origin)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        head, _, last = spec.name.rpartition(".")
        public = "tether" if head == "tether" else head
        # stacklevel 2 skips importlib's own frames: the warning points at the line that imported
        warnings.warn(f"{spec.name} is deprecated and is removed in tether {REMOVED_IN}: import what you need "
                      f"from {public} (the module is now the private {head}._{last})", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(f"{head}._{last}")

    def exec_module(self, module: ModuleType) -> None:
        return None  # already executed under its new name


def install() -> None:
    if not any(isinstance(f, RenamedModules) for f in sys.meta_path):
        sys.meta_path.append(RenamedModules())


def user_stacklevel() -> int:
    """The `warnings.warn` stack level of the first frame outside tether (the user's code that used an
    old form), counted from the caller of this function."""
    frame: FrameType | None = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]
    level = 1
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("tether"):
        frame, level = frame.f_back, level + 1
    return level
