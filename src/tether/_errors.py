"""`TetherError`: the one base of every error tether raises on purpose, so callers can catch them all
(`except tether.TetherError`). Each subclass also keeps its conventional base (ValueError for bad
input, RuntimeError for failures), so existing `except ValueError` code keeps working."""

from typing import Any


class TetherError(Exception):
    """Base of every error tether raises on purpose."""


class AwaitingApproval(TetherError):
    """Raised by a tool whose work waits for a person's decision (a sub-agent parked on an approval):
    the executor answers the call as awaiting approval, and the run stops (or waits) for it.
    `parked`: what the tool needs to go on once decided (kept in the run's state)."""

    def __init__(self, message: str, parked: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.parked = parked


class InvalidInput(TetherError, ValueError):
    """A value tether was given is wrong: an argument, a setting, a file's content."""


class InvalidType(TetherError, TypeError):
    """An object of the wrong kind was given (a tool function, a policy, a state)."""


class OperationFailed(TetherError, RuntimeError):
    """Something tether tried could not be done (a stream ended early, a process would not start)."""


class NotFound(TetherError, LookupError):
    """A named thing does not exist: a run, an agent, a reference."""


class MissingKey(NotFound, KeyError):
    """A key of a mapping-like object does not exist (a plan step)."""


class MissingDependency(TetherError, ImportError):
    """An optional package a feature needs is not installed (the message names the extra)."""


class MissingFile(TetherError, FileNotFoundError):
    """A file or folder tether was pointed at does not exist."""
