"""Every in-memory CLI run (`tether -p`, `tether run`, each `tether chat` turn) goes to the run
store once it ended, so `tether runs`, `tether runs stats` and the console cover it.

Written after the answer is printed, in one transaction: nothing on the run's per-step path. A store
that fails loses nothing but the record: one warning line on stderr, the exit code unchanged.
`--no-store` or TETHER_STORE=off skips it."""

from __future__ import annotations

import getpass
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from tether._types import RunResult
    from tether.store import RunStore

CLI_AGENT = "cli"
OFF = ("off", "0", "false", "no")


def storing(no_store: bool, env: Mapping[str, str] | None = None) -> bool:
    """Whether CLI runs are recorded: yes unless --no-store or TETHER_STORE=off (or 0, false, no)."""
    env = os.environ if env is None else env
    return not no_store and env.get("TETHER_STORE", "").strip().lower() not in OFF


def _login() -> str | None:
    """The person running the command: the console shows their runs to the user of that name."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return None


class RunRecorder:
    """Opens the store at the first run it records (`db`: a path or URL, else $TETHER_DB, else the
    default file) and keeps it for the next ones (a chat's turns)."""

    def __init__(self, db: str | None, console: Console) -> None:
        self.db = db
        self.console = console
        self.store: RunStore | None = None
        self.failed = False
        self._opening: threading.Thread | None = None
        self._open_error: Exception | None = None

    def open_soon(self) -> None:
        """Open the store on a thread while the run works (importing SQLAlchemy and checking the
        schema take a few hundred ms), so that only the write is left once the answer is out."""
        self._opening = threading.Thread(target=self._open, name="tether-run-store", daemon=True)
        self._opening.start()

    def _open(self) -> None:
        try:
            from tether.cli._durable_cmd import database
            from tether.store import RunStore

            self.store = RunStore(database(self.db))
        except Exception as exc:  # told when the run is recorded, after its answer
            self._open_error = exc

    def record(self, result: RunResult, prompt: str) -> None:
        if self.failed:  # said once; a chat does not repeat it every turn
            return
        try:
            if self._opening is not None:
                self._opening.join()
                self._opening = None
            elif self.store is None and self._open_error is None:
                self._open()
            if self._open_error is not None:
                raise self._open_error
            assert self.store is not None
            self.store.record_run(result, agent=CLI_AGENT, user=_login(), prompt=prompt)
        except Exception as exc:
            from tether.cli._durable_cmd import error_line

            self.failed = True
            self.console.print(f"tether: warning: run {result.run_id} was not stored: {error_line(exc)} "
                               "(--no-store or TETHER_STORE=off skips the run store)", style="yellow",
                               markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._opening is not None:
            self._opening.join()
            self._opening = None
        if self.store is not None:
            self.store.close()
            self.store = None


def recorder(no_store: bool, db: str | None, console: Console) -> RunRecorder | None:
    """A recorder, or None when storing is off."""
    return RunRecorder(db, console) if storing(no_store) else None


__all__ = ["RunRecorder", "recorder", "storing"]
