"""The public surface: `tether` exports what users need, and every error tether raises on purpose
derives from one `TetherError` (issue 25, item 4)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import tether


def test_every_exported_name_exists() -> None:
    for name in tether.__all__:
        assert getattr(tether, name) is not None, name


def test_every_error_class_in_tether_derives_from_tether_error() -> None:
    missing = []
    for info in pkgutil.walk_packages(tether.__path__, "tether."):
        if info.name.startswith(("tether.cli.__main__", "tether.__main__")):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == info.name
                    and not name.startswith("_") and not issubclass(obj, tether.TetherError)):
                missing.append(f"{info.name}.{name}")
    assert missing == [], missing


def test_errors_keep_their_conventional_bases() -> None:
    from tether.evals import SuiteError
    from tether.models._base import ModelError

    assert issubclass(SuiteError, ValueError) and issubclass(ModelError, RuntimeError)


def test_durable_false_is_not_durable() -> None:
    # (pyright found it: durable=False went to attach() and failed there with a TypeError)
    agent = tether.Agent(tether.ScriptedModel([tether.reply("ok")]), durable=False)
    assert agent.durable is None
    assert agent.run("hi").answer == "ok"


def test_no_two_public_classes_share_a_name() -> None:
    # (there were two RunState and two Endpoint: the policy's per-run state is PolicyState, the
    # endpoints `tether models` lists are ConfiguredEndpoint)
    homes: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(tether.__path__, "tether."):
        if info.name.startswith(("tether.cli.__main__", "tether.__main__")):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == info.name and not name.startswith("_"):
                homes.setdefault(name, []).append(info.name)
    assert {n: m for n, m in homes.items() if len(m) > 1} == {}


def test_tether_raises_no_bare_builtin_error() -> None:
    """Every `raise X(...)` in tether's source raises a TetherError subclass (each also keeps its
    conventional base: InvalidInput is a ValueError, MissingFile a FileNotFoundError), so
    `except tether.TetherError` catches whatever tether raises on purpose. Allowed: the import
    protocol's AttributeError in a module's `__getattr__`, NotImplementedError, re-raises, and
    `OSError(errno, ...)` in the file walker that mirrors system calls (OSError itself picks the
    subclass from the errno, FileNotFoundError or IsADirectoryError, which its callers catch)."""
    import ast
    import builtins
    from pathlib import Path

    bare = []
    root = Path(tether.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                exc = node.exc if isinstance(node, ast.Raise) else None
                name = exc.func.id if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) else None
                builtin = getattr(builtins, name, None) if name else None
                if (isinstance(builtin, type) and issubclass(builtin, BaseException)
                        and name not in ("NotImplementedError", "StopIteration", "StopAsyncIteration")
                        and not (fn.name == "__getattr__" and name == "AttributeError")
                        and not (name == "OSError" and path.name in ("_beneath.py", "_idmap.py"))):
                    bare.append(f"{path.relative_to(root)}:{node.lineno} raise {name}")
    assert bare == [], bare
    assert issubclass(tether.InvalidInput, ValueError) and issubclass(tether.MissingFile, FileNotFoundError)


# The public surface: these modules, and the names in their __all__. Everything else is implementation.
PUBLIC_MODULES = ("tether", "tether.context", "tether.durable", "tether.evals", "tether.events", "tether.mcp",
                  "tether.models", "tether.plan", "tether.policy", "tether.rag", "tether.server", "tether.steps",
                  "tether.store", "tether.team", "tether.telemetry", "tether.tools", "tether.tools.builtin",
                  "tether.values")


def test_the_docs_and_examples_import_only_public_names() -> None:
    """Every `from tether... import NAME` in the README, the docs and the examples names a public
    module and a name in its __all__ (or a module's own public function where it has no __all__)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "examples").rglob("*.py"))]
    wrong = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"^\s*from (tether[\w.]*) import \(?([\w, \n]+?)\)?\s*$", text, re.MULTILINE):
            module, names = m.group(1), [n.strip() for n in m.group(2).replace("\n", ",").split(",") if n.strip()]
            if module not in PUBLIC_MODULES:
                wrong.append(f"{path.name}: from {module} import {', '.join(names)}")
                continue
            exported = getattr(importlib.import_module(module), "__all__", None)
            for name in names:
                name = name.split(" as ")[0].strip()
                if exported is not None and name not in exported:
                    wrong.append(f"{path.name}: {module}.{name} is not in its __all__")
        for m in re.finditer(r"^\s*import (tether[\w.]*)", text, re.MULTILINE):
            if m.group(1) not in PUBLIC_MODULES:
                wrong.append(f"{path.name}: import {m.group(1)}")
    assert wrong == [], "\n".join(wrong)


def test_every_public_modules_all_names_exist() -> None:
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            assert getattr(mod, name, None) is not None, f"{module}.{name}"
