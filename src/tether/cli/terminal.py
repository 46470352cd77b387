"""The terminal sanitiser lives in `tether.terminal` (one for the whole package); re-exported here."""

from tether.terminal import CleanWriter, clean, json_safe

__all__ = ["CleanWriter", "clean", "json_safe"]
