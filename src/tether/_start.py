"""Start-up under `python -m tether` (or `python -m tether.cli`): the working directory, which the agent
writes, must not decide what Python imports. Python put it on sys.path (`-m` without `-P`, and every
empty or relative PYTHONPATH entry), and `site` may already have imported a sitecustomize.py from it
before any of tether ran. Uses only sys and os, already imported by then."""

from __future__ import annotations

import os
import sys

SAFE_WAY = ("run the installed `tether` command, or `python -P -m tether` with only absolute "
            "PYTHONPATH entries, from a directory the agent does not write")


def unsafe_roots() -> set[str]:
    """The sys.path directories the working directory decides: itself (`python -m` without `-P`) and
    each empty (the working directory) or relative PYTHONPATH entry, resolved."""
    cwd = os.getcwd()
    roots = set() if sys.flags.safe_path else {cwd}
    pythonpath = "" if sys.flags.ignore_environment else os.environ.get("PYTHONPATH", "")
    if pythonpath:  # an empty variable adds nothing; an empty entry in a set one adds the cwd
        roots.update(os.path.join(cwd, entry) for entry in pythonpath.split(os.pathsep)
                     if not os.path.isabs(entry))
    return {os.path.realpath(root) for root in roots}


def shadowing(roots: set[str]) -> list[tuple[str, str]]:
    """(name, file) of each imported top-level module that tether, `site` or the standard library
    stands behind (tether, sitecustomize, usercustomize, a standard-library name) loaded from `roots`."""
    names = sys.stdlib_module_names | {"tether", "sitecustomize", "usercustomize"}
    found: list[tuple[str, str]] = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) if name in names else None
        if not isinstance(file, str):
            continue
        where = os.path.dirname(os.path.abspath(file))
        if os.path.basename(file).startswith("__init__."):  # a package: its directory's parent
            where = os.path.dirname(where)
        if os.path.realpath(where) in roots:
            found.append((name, file))
    return found


def guard_module_run() -> None:
    """Refuse to start (one line, exit 1) when tether or a module it relies on was imported from a
    directory the working directory decides; otherwise take those directories off sys.path before
    anything else is imported. A tether/ package in the working directory itself is out of reach:
    `python -m tether` then runs that copy, not this one (docs/cli.md says how to start tether safely)."""
    roots = unsafe_roots()
    if not roots:
        return
    found = shadowing(roots)
    if found:
        name, file = found[0]
        sys.stderr.write(f"tether: refusing to start: {name} was imported from {file!r}, a directory the "
                         f"working directory decides (python -m, or an empty or relative PYTHONPATH entry); "
                         f"{SAFE_WAY}\n")
        sys.exit(1)
    sys.path[:] = [p for p in sys.path if os.path.isabs(p) and os.path.realpath(p) not in roots]


def quiet_ctrl_c_while_starting() -> None:
    """Until the command's `main` takes over (`ctrl_c_is_main_s`), Ctrl-C during start-up (the imports
    take a second or more on a busy machine) exits 130 with one line instead of a traceback."""
    import signal

    def interrupted(signum: int, frame: object) -> None:
        sys.stderr.write("tether: interrupted\n")
        sys.stderr.flush()
        os._exit(130)

    interrupted.tether_start = True  # type: ignore[attr-defined]  # recognised by ctrl_c_is_main_s
    signal.signal(signal.SIGINT, interrupted)


def ctrl_c_is_main_s() -> None:
    """Give Ctrl-C back to Python's KeyboardInterrupt, which `main` answers (cancelling a run cleanly);
    only the start-up handler above is replaced, never one an embedding program installed."""
    import signal

    if getattr(signal.getsignal(signal.SIGINT), "tether_start", False):
        signal.signal(signal.SIGINT, signal.default_int_handler)
