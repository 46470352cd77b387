"""`CliError`: what the CLI reports to the user as one line."""

from __future__ import annotations

from tether._errors import TetherError


class CliError(TetherError):
    """A problem with what the user asked for; printed as is, exit code 1 (`exit_code` 2: a usage error)."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
