"""Model resolution: spec parsing, the precedence, the local fallback and the no-model explanation."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer, chat_completion
from typer.testing import CliRunner

from tether._types import Message, ModelReply, ModelRequest
from tether.models import _resolve as resolve
from tether.models._openai_compat import OpenAICompatModel
from tether.models._resolve import (
    HOW_TO_CONFIGURE,
    ModelConfigError,
    ModelSpec,
    configured_endpoints,
    default_choice,
    parse_spec,
    resolve_model,
)


@pytest.mark.parametrize(("spec", "expected"), [
    ("openai:gpt-4o", ModelSpec("openai", "gpt-4o")),
    ("OpenRouter:meta/llama-3:free", ModelSpec("openrouter", "meta/llama-3:free")),
    ("anthropic:claude-haiku-4-5", ModelSpec("anthropic", "claude-haiku-4-5")),
    ("local", ModelSpec("local", "")),
    ("local:/models/x.gguf", ModelSpec("local", "/models/x.gguf")),
    ("anthropic/claude-haiku-4.5", ModelSpec(None, "anthropic/claude-haiku-4.5")),
    ("llama3:8b", ModelSpec(None, "llama3:8b")),
    ("  gpt-4o-mini ", ModelSpec(None, "gpt-4o-mini")),
    ("localhost-model", ModelSpec(None, "localhost-model")),
])
def test_parse_spec(spec: str, expected: ModelSpec) -> None:
    assert parse_spec(spec) == expected


def test_empty_spec_is_an_error() -> None:
    with pytest.raises(ModelConfigError, match="model spec is empty"):
        parse_spec("  ")


def _compat(model: object) -> OpenAICompatModel:
    assert isinstance(model, OpenAICompatModel)
    return model


def test_explicit_spec_beats_tether_model() -> None:
    env = {"TETHER_MODEL": "other", "OPENAI_API_KEY": "k"}
    model = _compat(resolve_model("openai:gpt-x", env=env))
    assert (model.name, model.base_url) == ("gpt-x", "https://api.openai.com/v1")


def test_tether_model_beats_endpoints_from_env() -> None:
    env = {"TETHER_MODEL": "openrouter:foo/bar", "OPENAI_API_KEY": "k", "OPENROUTER_API_KEY": "r"}
    model = _compat(resolve_model(env=env))
    assert (model.name, model.base_url) == ("foo/bar", "https://openrouter.ai/api/v1")


def test_bare_tether_model_uses_the_configured_endpoint() -> None:
    env = {"TETHER_MODEL": "qwen2.5:7b", "OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}
    model = _compat(resolve_model(env=env))
    assert (model.name, model.base_url) == ("qwen2.5:7b", "http://127.0.0.1:11434/v1")


def test_openai_env_beats_openrouter_env() -> None:
    env = {"OPENAI_API_KEY": "k", "OPENROUTER_API_KEY": "r", "OPENROUTER_BASE_URL": "http://x/v1"}
    model = _compat(resolve_model(env=env))
    assert (model.name, model.base_url) == ("gpt-4o-mini", "https://api.openai.com/v1")


def test_openrouter_env_defaults_to_claude_haiku() -> None:
    model = _compat(resolve_model(env={"OPENROUTER_API_KEY": "r", "OPENROUTER_BASE_URL": "http://localhost:10000/api/v1"}))
    assert (model.name, model.base_url) == ("anthropic/claude-haiku-4.5", "http://localhost:10000/api/v1")


def test_explicit_provider_does_not_borrow_the_other_providers_key() -> None:
    """openrouter:NAME sends the OpenRouter key even when OPENAI_API_KEY (which wins by default) is set."""
    with FakeOpenAIServer([chat_completion("hi")]) as server:
        model = resolve_model("openrouter:x/y", env={"OPENAI_API_KEY": "sk-openai", "OPENROUTER_API_KEY": "sk-or",
                                                     "OPENROUTER_BASE_URL": server.base_url})
        reply = _run(model.complete(ModelRequest([Message.user("hello")])))
    assert reply.text == "hi"
    assert server.requests[0].headers["authorization"] == "Bearer sk-or"
    assert server.requests[0].body["model"] == "x/y"


def test_bare_name_with_base_url_and_no_key_reaches_the_server() -> None:
    with FakeOpenAIServer([chat_completion("ok")]) as server:
        model = resolve_model("my-local-model", base_url=server.base_url, env={})
        assert _run(model.complete(ModelRequest([Message.user("x")]))).text == "ok"
    assert server.requests[0].body["model"] == "my-local-model"
    assert server.requests[0].headers["authorization"] == "Bearer no-key"


def test_missing_keys_for_hosted_providers_are_explained() -> None:
    with pytest.raises(ModelConfigError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-4o", env={"OPENROUTER_API_KEY": "r"})
    with pytest.raises(ModelConfigError, match="OPENROUTER_API_KEY"):
        resolve_model("openrouter:x", env={"OPENAI_API_KEY": "k"})


def test_bare_name_with_nothing_configured_explains_how() -> None:
    with pytest.raises(ModelConfigError) as info:
        resolve_model("gpt-4o", env={})
    assert str(info.value).startswith(HOW_TO_CONFIGURE)


def test_no_model_and_no_local_module_gives_one_paragraph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tether.models._local", None)  # import now raises ImportError
    with pytest.raises(ModelConfigError) as info:
        resolve_model(env={})
    message = str(info.value)
    assert message.startswith(HOW_TO_CONFIGURE)
    assert "\n" not in message
    for needle in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "--model", "TETHER_MODEL", "tether[local]"):
        assert needle in message


def test_no_model_and_no_llama_cpp_gives_one_paragraph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve, "local_runtime_installed", lambda: False)
    with pytest.raises(ModelConfigError) as info:
        resolve_model(env={})
    assert str(info.value).startswith(HOW_TO_CONFIGURE)
    assert "xllamacpp (the embedded model's llama.cpp) is not installed" in str(info.value)


class _FakeLocalModel:
    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.name = "local:fake"


def _fake_local_module(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("tether.models._local")
    module.LocalModel = _FakeLocalModel  # type: ignore[attr-defined]
    module.LocalModelUnavailable = RuntimeError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tether.models._local", module)
    monkeypatch.setattr(resolve, "local_runtime_installed", lambda: True)


def test_local_fallback_is_announced_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_local_module(monkeypatch)
    said: list[str] = []
    model = resolve_model(env={}, announce=said.append)
    assert isinstance(model, _FakeLocalModel) and model.path is None
    assert len(said) == 1 and "embedded local model" in said[0]


def test_local_path_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_local_module(monkeypatch)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    model = resolve_model(f"local:{gguf}", env={"OPENAI_API_KEY": "k"})
    assert isinstance(model, _FakeLocalModel) and model.path == str(gguf)
    with pytest.raises(ModelConfigError, match="no such GGUF file"):
        resolve_model(f"local:{tmp_path / 'missing.gguf'}", env={})


def test_text_protocol_wraps_the_model() -> None:
    from tether.models._text_protocol import TextProtocolModel

    model = resolve_model("openai:gpt-x", api_key="k", text_protocol="react", env={})
    assert isinstance(model, TextProtocolModel) and model.protocol == "react"
    assert model.name == "gpt-x"
    with pytest.raises(ModelConfigError, match="unknown text protocol"):
        resolve_model("openai:gpt-x", api_key="k", text_protocol="xml", env={})


def test_anthropic_spec() -> None:
    pytest.importorskip("anthropic")
    from tether.models._anthropic import AnthropicModel

    model = resolve_model("anthropic:claude-haiku-4-5", api_key="k", env={})
    assert isinstance(model, AnthropicModel) and model.name == "claude-haiku-4-5"


def test_endpoints_listing_never_holds_keys() -> None:
    env = {"OPENAI_API_KEY": "sk-1", "OPENROUTER_API_KEY": "sk-2", "ANTHROPIC_API_KEY": "sk-3"}
    endpoints = configured_endpoints(env)
    assert [e.name for e in endpoints] == ["openai", "openrouter", "anthropic"]
    assert "sk-" not in repr(endpoints)
    assert default_choice(env).startswith("gpt-4o-mini at https://api.openai.com/v1")
    assert default_choice({"TETHER_MODEL": "local"}) == "TETHER_MODEL=local"


def test_cli_without_any_model_explains_in_one_paragraph(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tether.cli._app import app

    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENROUTER_API_KEY", "OPENROUTER_BASE_URL", "TETHER_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(sys.modules, "tether.models._local", None)
    result = CliRunner().invoke(app, ["-p", "hello", "--workspace", str(tmp_path)], prog_name="tether")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("tether: " + HOW_TO_CONFIGURE)
    assert result.stderr.count("\n") == 1  # one paragraph, one line


def _run(coro: Coroutine[Any, Any, ModelReply]) -> ModelReply:
    return asyncio.run(coro)


@pytest.mark.parametrize("spec", [None, "openrouter:x/y", "openai:gpt-x", "bare-name"])
def test_a_base_url_never_receives_a_key_configured_for_another_endpoint(spec: str | None) -> None:
    """Issue 8.7: only OPENROUTER_API_KEY / OPENAI_API_KEY set, and --base-url X: X gets no key and no
    OpenRouter model name."""
    env = {"OPENROUTER_API_KEY": "sk-or-secret", "OPENAI_API_KEY": "sk-oa-secret"}
    with FakeOpenAIServer([chat_completion("hi")]) as server:
        model = resolve_model(spec, base_url=server.base_url, env=env)
        _run(model.complete(ModelRequest([Message.user("hello")])))
    seen = server.requests[0]
    assert seen.headers["authorization"] == "Bearer no-key"
    if spec is None:
        assert seen.body["model"] == "gpt-4o-mini"  # the documented default, not OpenRouter's


def test_the_model_deadline_reaches_the_adapter() -> None:
    model = resolve_model("openai:x", base_url="http://127.0.0.1:9/v1", env={}, deadline=7.5)
    assert model.policy.deadline == 7.5  # type: ignore[attr-defined]
    assert resolve_model("openai:x", base_url="http://127.0.0.1:9/v1", env={}, deadline=None).policy.deadline is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("base_url", "env"), [("localhost:8080", {}), (None, {"OPENROUTER_BASE_URL": "ftp://x/v1"})])
def test_a_base_url_without_http_is_refused_up_front(base_url: str | None, env: dict[str, str]) -> None:
    with pytest.raises(ModelConfigError, match=r"is not an http\(s\) URL"):
        resolve_model("openai:x", base_url=base_url, env=env | {"OPENAI_API_KEY": "k"})
