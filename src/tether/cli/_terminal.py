"""The terminal sanitiser lives in `tether._terminal` (one for the whole package); re-exported here."""

from tether._terminal import CleanWriter, clean, json_safe

__all__ = ["CleanWriter", "clean", "json_safe"]
