"""Test-wide settings: under CI=true the property tests draw the same examples every run (a red CI
must mean a change broke something, not that a new random example turned up); locally they explore."""

from __future__ import annotations

import os

try:
    from hypothesis import settings
except ImportError:  # hypothesis is in the dev extra
    settings = None

if settings is not None:
    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI") == "true":
        settings.load_profile("ci")
