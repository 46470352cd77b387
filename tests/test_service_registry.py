"""Agents from a TOML file: their tools, limits and safety policy, bad files refused with one line
naming the key; and a TOML agent served end to end over a real OpenAI-compatible HTTP model that
streams its reply (so `text_delta` events come from a real adapter, not a test model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call

from tether.policy import Capabilities
from tether.server._registry import RegistryError, load_registry

httpx = pytest.importorskip("httpx")


def _toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(body)
    return path


def test_toml_agent_with_a_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # built, never called
    path = _toml(tmp_path, f"""
[agents.ops]
model = "openai:gpt-4o-mini"
tools = "calculator,files"
workspace = "{tmp_path}"
instructions = "Be brief."
limits = {{ max_steps = 4 }}

[agents.ops.policy]
egress = ["api.example.com"]

[agents.ops.policy.tools.Write]
requires_approval = true
per_run = 2
""")
    registry = load_registry(path)
    agent = registry.build("ops", "alice", {"max_steps": 9})  # a task may narrow limits, never widen
    assert agent.user == "alice" and agent.limits.max_steps == 4
    caps = agent.policy.capabilities
    assert isinstance(caps, Capabilities) and caps.unlisted == "inherit"
    assert caps.caps["Write"].requires_approval and caps.caps["Write"].per_run == 2
    assert agent.policy.egress.allows_host("api.example.com") and not agent.policy.egress.allows_host("evil.test")
    assert registry.build("ops", "bob", None).policy is not agent.policy  # per-run state is never shared


@pytest.mark.parametrize(("policy", "needle"), [
    ("[agents.a.policy]\nunlisted = 'maybe'", "unlisted must be 'deny' or 'inherit'"),
    ("[agents.a.policy]\nallow = 1", "policy has unknown keys ['allow']"),
    ("[agents.a.policy.tools.Bash]\nrequires_approval = true", "policy.tools.Bash: the agent has no such tool"),
    ("[agents.a.policy.tools.calculator]\nrequire_approval = true", "unknown keys ['require_approval']"),
    ("[agents.a.policy.tools.calculator]\non_untrusted = 'shrug'", "on_untrusted must be approve, refuse or summarize"),
    ("[agents.a.policy]\negress = 'example.com'", "policy.egress must be a list"),
    ("[agents.a.policy]\negress = ['*.github.io']", "public suffix 'github.io'"),
    ("[agents.a.policy]\nhidden_values = 'no'", "policy.hidden_values must be true"),
])
def test_bad_policies_are_refused_at_start(tmp_path: Path, policy: str, needle: str) -> None:
    path = _toml(tmp_path, f"[agents.a]\ntools = 'calculator'\n{policy}\n")
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    assert str(info.value).startswith(f"{path}: agents.a: ") and needle in str(info.value)


def test_a_toml_policy_chooses_the_visible_mode(tmp_path: Path) -> None:
    """`hidden_values = false`: the old visible mode (no handles, no inspect_value); hiding stays the default."""
    path = _toml(tmp_path, "[agents.seen]\ntools = 'calculator'\n[agents.seen.policy]\nhidden_values = false\n"
                           "[agents.hid]\ntools = 'calculator'\n[agents.hid.policy]\nunlisted = 'inherit'\n")
    registry = load_registry(path)
    assert registry.build("seen", "alice").policy.hidden_values is False
    assert registry.build("hid", "alice").policy.hidden_values is True


def test_a_toml_agent_served_over_a_streaming_http_model(tmp_path: Path) -> None:
    from test_service import Service, events, submit, wait_status

    answer = "Seventeen times twenty-three is 391."
    script = [chat_completion(None, [tool_call("calculator", {"expression": "17*23"})]), chat_completion(answer)]
    with FakeOpenAIServer(script) as model:
        path = _toml(tmp_path, """
[agents.math]
model = "fake-model"
tools = "calculator"
limits = { max_steps = 4 }
[agents.math.policy]
unlisted = "deny"
[agents.math.policy.tools.calculator]
""")
        service = Service(tmp_path)
        service.env.update({"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "sk-test"})
        service.start(str(path))
        try:
            alice = service.key("alice")
            task = submit(service, alice, "math", prompt="What is 17 * 23?")
            got = events(service, alice, task)
            body = wait_status(service, alice, task, "completed")
        finally:
            service.stop()
        assert body["answer"] == answer
        got = [e for e in got if not e["event"].endswith("_started")]  # the ends, as they were stored before
        names = [e["event"] for e in got]
        assert names[:3] == ["status", "model_call", "tool_call"] and names[-2:] == ["answer", "stop"]
        assert got[2]["data"]["name"] == "calculator" and got[2]["data"]["decision"] == "allowed"
        assert "391" in json.dumps(model.requests[1].body["messages"][-1])  # the tool's result went back
        pieces = [e["data"]["text"] for e in got if e["event"] == "text_delta"]
        assert len(pieces) >= 1 and "".join(pieces) == answer
        assert all(r.body.get("stream") is True for r in model.requests)  # the service streams every call
