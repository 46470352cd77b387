"""The secret scan's prefilter (`secret_patterns_for`) leaves out only patterns that match nowhere:
every text a pattern matches keeps that pattern, short (one combined search) or long (literal tests)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.policy import _leaks, _output_filter
from tether.policy._leaks import secrets_in
from tether.policy._output_filter import SECRET_PATTERNS, SHORT_TEXT, scan, secret_patterns_for

# case-insensitive matching equates these with ASCII letters (the fold must keep them findable)
_ODD = "\u0130\u0131\u017f\u212aKkSsIi"
PAD = "x " * (SHORT_TEXT // 2 + 1)  # makes any text long: the literal tests decide


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_a_pattern_that_matches_is_kept_short_or_long(data: st.DataObject) -> None:
    label, pattern = data.draw(st.sampled_from(SECRET_PATTERNS))
    text = data.draw(st.from_regex(pattern, alphabet=st.characters(codec="utf-8") | st.sampled_from(_ODD)))
    assert pattern.search(text) is not None
    for t in (text, PAD + text + PAD, text[:SHORT_TEXT]):
        if pattern.search(t) is not None:
            assert (label, pattern) in secret_patterns_for(t), (label, t)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("aApPsSwWdDoOrRkKeEyYtTnNcC12 :=-_\u0130\u0131\u017f\u212a\n"), max_size=80))
def test_left_out_patterns_match_nowhere(text: str) -> None:
    for t in (text, PAD + text):
        kept = secret_patterns_for(t)
        for label, pattern in SECRET_PATTERNS:
            if (label, pattern) not in kept:
                assert pattern.search(t) is None, (label, t)


def test_the_scans_find_what_they_found_before(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = ["password: hunter2!xyz", "the API key is sk-abcdefghijklmnopqrstuvwxyz12", "AKIA" + "A" * 16,
             "PAS\u017fWORD = Zq8-long-value", "nothing to see here", "my pin is 4821", PAD + "api_key=abc123def456",
             "value-12", PAD + "eyJabcdefghij.eyJabcdefghij.abcdefghij and ghp_" + "a" * 36]
    filtered = [(scan(t), secrets_in(t)) for t in texts]
    assert filtered[0][1] == {"hunter2!xyz"} and filtered[3][1] == {"Zq8-long-value"}
    assert filtered[6][1] == {"abc123def456"} and len(filtered[8][0]) == 2
    for module in (_leaks, _output_filter):
        monkeypatch.setattr(module, "secret_patterns_for", lambda text: SECRET_PATTERNS)
    assert [(scan(t), secrets_in(t)) for t in texts] == filtered


SENTENCE_WORDS = ["password", "passphrase", "passcode", "passwd", "pin", "secret", "api key", "api-key", "apikey",
                  "access token", "access_token", "accesstoken", "security code", "2fa code", "login code"]
ASSIGNMENT_WORDS = ["password", "passwd", "pwd", "secret", "api_key", "api-key", "apikey", "access_token",
                    "access-token", "accesstoken", "auth_token", "auth-token", "authtoken"]


def test_every_keyword_of_the_case_insensitive_patterns_is_kept() -> None:
    texts = [f"the {w} is Zq8-{i}!long" for i, w in enumerate(SENTENCE_WORDS)]
    texts += [f"{w}: Zq8-long-{i}" for i, w in enumerate(ASSIGNMENT_WORDS)]
    texts += [t.upper() for t in texts] + [t.replace("s", "\u017f").replace("i", "\u0131") for t in texts]
    for text in texts:
        for t in (text, PAD + text):
            matching = [(label, p) for label, p in SECRET_PATTERNS if p.search(t)]
            assert matching, t
            assert all(m in secret_patterns_for(t) for m in matching), t


def test_the_environment_secrets_follow_every_change_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _leaks.environment_secrets(os.environ)
    assert _leaks.environment_secrets(os.environ) == before == _leaks._environment_secrets(os.environ)
    monkeypatch.setenv("TETHER_TEST_PREFILTER_KEY", "Zq8-very-secret-42")
    assert "Zq8-very-secret-42" in _leaks.environment_secrets(os.environ)
    monkeypatch.setenv("TETHER_TEST_PREFILTER_KEY", "Zq8-other-secret-43")
    assert "Zq8-very-secret-42" not in (now := _leaks.environment_secrets(os.environ))
    assert "Zq8-other-secret-43" in now
    monkeypatch.delenv("TETHER_TEST_PREFILTER_KEY")
    assert _leaks.environment_secrets(os.environ) == before
    env = {"API": "Zq8-very-secret-42"}
    assert _leaks.environment_secrets(env) == ["Zq8-very-secret-42"]
    env["API"] = "localhost"  # the same dict, changed in place
    assert _leaks.environment_secrets(env) == []
