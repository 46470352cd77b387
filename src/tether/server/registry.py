"""Named agent configurations the service runs: from a TOML file or a Python module.

TOML (`tether serve --agents agents.toml`):

    [agents.assistant]
    model = "openai:gpt-4o-mini"          # as for `tether --model`; omitted: the environment's default
    tools = "calculator,files"            # tool sets, as for `tether --tools`
    workspace = "/srv/tether/ws"          # for file and shell tools
    instructions = "Answer briefly."
    limits = { max_steps = 10, max_seconds = 120 }

Python (`--agents mymodule:AGENTS` or `--agents path/agents.py:AGENTS`): a dict of name -> function
`(user) -> Agent`. Whatever the source, every agent's calls that need approval park the run for a
person (the service's confirm endpoint) instead of being denied.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether._refs import load_ref
from tether.agent import Agent
from tether.limits import Limits

AgentFactory = Callable[[str | None], Agent]


class RegistryError(ValueError):
    """Agent configurations that cannot be used (one line saying what to change)."""


@dataclasses.dataclass
class Registry:
    """name -> factory(user) -> Agent."""

    factories: dict[str, AgentFactory]

    def names(self) -> list[str]:
        return sorted(self.factories)

    def build(self, name: str, user: str | None, limits: dict[str, Any] | None = None) -> Agent:
        """The agent `name` acting as `user`, its limits narrowed by `limits` (a task may ask for
        less than the configuration allows, never more)."""
        if name not in self.factories:
            raise RegistryError(f"no agent named {name!r}; agents: {', '.join(self.names()) or 'none'}")
        agent = self.factories[name](user)
        agent.user = user
        agent.name = name
        if limits:
            agent.limits = narrow(agent.limits, limits)
        _park_approvals(agent)
        return agent


def narrow(base: Limits, asked: dict[str, Any]) -> Limits:
    known = {f.name for f in dataclasses.fields(Limits)}
    bad = sorted(set(asked) - known)
    if bad:
        raise RegistryError(f"unknown limits {bad}; known: {sorted(known)}")
    values: dict[str, Any] = {}
    for key, value in asked.items():
        current = getattr(base, key)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise RegistryError(f"limits.{key} must be a positive number, got {value!r}")
        values[key] = value if current is None else min(current, value)
    return dataclasses.replace(base, **values)


def _park_approvals(agent: Agent) -> None:
    from tether.policy import ApprovalBook, PendingApprover

    if hasattr(agent.policy, "approver"):
        agent.policy.approver = PendingApprover(ApprovalBook())  # type: ignore[union-attr]


def load_registry(ref: str | Path) -> Registry:
    """From a `.toml` file, or `module:NAME` / `file.py:NAME` naming a dict of factories."""
    text = str(ref)
    if text.endswith(".toml"):
        return _from_toml(Path(text))
    if ":" not in text:
        raise RegistryError(f"--agents {text!r}: give a .toml file or module:NAME (a dict of name -> factory)")
    try:
        found = load_ref(text, Path.cwd())
    except LookupError as exc:
        raise RegistryError(f"--agents: {exc}") from exc
    if not isinstance(found, dict) or not found or not all(callable(f) for f in found.values()):
        raise RegistryError(f"--agents: {text} must be a non-empty dict of name -> function(user) -> Agent")
    return Registry(dict(found))


def _from_toml(path: Path) -> Registry:
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise RegistryError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path}: invalid TOML: {exc}") from exc
    agents = data.get("agents")
    if not isinstance(agents, dict) or not agents:
        raise RegistryError(f"{path}: no [agents.NAME] tables")
    allowed = {"model", "tools", "workspace", "instructions", "limits"}
    factories: dict[str, AgentFactory] = {}
    for name, cfg in agents.items():
        if not isinstance(cfg, dict):
            raise RegistryError(f"{path}: agents.{name} must be a table")
        extra = sorted(set(cfg) - allowed)
        if extra:
            raise RegistryError(f"{path}: agents.{name} has unknown keys {extra}; known: {sorted(allowed)}")
        factories[name] = _toml_factory(path, name, cfg)
    return Registry(factories)


def _toml_factory(path: Path, name: str, cfg: dict[str, Any]) -> AgentFactory:
    from tether.cli.build import CliError, build_tools
    from tether.models.resolve import ModelConfigError, parse_spec, resolve_model

    workspace = Path(cfg.get("workspace") or ".").expanduser().resolve()
    try:  # fail at start, not at the first task (the model itself is built per agent)
        limits = narrow(Limits(), cfg.get("limits") or {}) if cfg.get("limits") else Limits()
        build_tools(cfg.get("tools") or "none", workspace)
        if cfg.get("model"):
            parse_spec(str(cfg["model"]))
    except (RegistryError, CliError, ModelConfigError) as exc:
        raise RegistryError(f"{path}: agents.{name}: {exc}") from exc

    def build(user: str | None) -> Agent:
        try:
            tools = build_tools(cfg.get("tools") or "none", workspace)
            model = resolve_model(cfg.get("model"))
        except (CliError, ModelConfigError) as exc:
            raise RegistryError(f"{path}: agents.{name}: {exc}") from exc
        return Agent(model, tools=tools, instructions=str(cfg.get("instructions") or ""), limits=limits, user=user,
                     name=name)

    return build
