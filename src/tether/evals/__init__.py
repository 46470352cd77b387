"""Evaluation: record and replay runs as cassettes, scenario suites with expectations, reports.

    suite = load_suite("examples/ops_assistant/suite.toml")
    report = await run_suite(suite)                 # replays the cassettes, no network
"""

from tether.evals._cassette import Cassette, CassettePlayer, CassetteRecorder, Drift, cassette_from_state
from tether.evals._runner import run_scenario, run_suite
from tether.evals._suite import Expect, Scenario, Suite, SuiteError, load_suite

__all__ = [
           "Cassette",
           "CassettePlayer",
           "CassetteRecorder",
           "Drift",
           "Expect",
           "Scenario",
           "Suite",
           "SuiteError",
           "cassette_from_state",
           "load_suite",
           "run_scenario",
           "run_suite",
]
