"""Load the object a `file.py:NAME` or `package.module:NAME` reference names (suites, agent registries)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from tether._errors import NotFound


def load_ref(ref: str, base: Path) -> Any:
    """The object `ref` names; a `.py` path is relative to `base`. Raises LookupError saying what is wrong."""
    target, _, attr = ref.partition(":")
    if not attr:
        raise NotFound(f"{ref!r} must look like 'file.py:NAME' or 'package.module:NAME'")
    if target.endswith(".py"):
        file = (base / target).resolve()
        if not file.exists():
            raise NotFound(f"{file} does not exist (named by {ref!r})")
        name = f"_tether_ref_{abs(hash(str(file)))}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise NotFound(f"cannot import {target!r} (named by {ref!r}): {exc}") from exc
    if not hasattr(module, attr):
        raise NotFound(f"{ref!r}: {target} has no {attr!r}")
    return getattr(module, attr)
