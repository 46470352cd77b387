"""`TetherError`: the one base of every error tether raises on purpose, so callers can catch them all
(`except tether.TetherError`). Each subclass also keeps its conventional base (ValueError for bad
input, RuntimeError for failures), so existing `except ValueError` code keeps working."""


class TetherError(Exception):
    """Base of every error tether raises on purpose."""
