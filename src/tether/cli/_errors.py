"""`CliError`: what the CLI reports to the user as one line."""

from __future__ import annotations

from tether._errors import TetherError


class CliError(TetherError):
    """A problem with what the user asked for; printed as is, exit code 1."""
