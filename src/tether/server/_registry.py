"""Named agent configurations the service runs: from a TOML file or a Python module.

TOML (`tether serve --agents agents.toml`):

    [agents.assistant]
    model = "openai:gpt-4o-mini"          # as for `tether --model`; omitted: the environment's default
    tools = "calculator,files"            # tool sets, as for `tether --tools`
    workspace = "/srv/tether/ws"          # for file and shell tools
    staged = true                         # (default) each task writes a staged copy of the workspace,
                                          # reviewed and applied through /v1/tasks/ID/changes and /apply
    instructions = "Answer briefly."
    limits = { max_steps = 10, max_seconds = 120 }
    strictness = "standard"               # the safety filter on each request and answer: off (default),
                                          # lenient, standard, strict; or { input = "strict", output = "off" }
    plan = true                           # plan mode (docs/plan-mode.md): the model writes the plan, its
                                          # approvals park the task for the confirm endpoint
    options = { max_result_chars = 20000 }  # any other Agent (or, with plan, PlanAgent) option by name

    [agents.assistant.policy]             # optional: the safety policy (tether.policy.SafetyPolicy)
    unlisted = "inherit"                  # tools not under [..policy.tools]: their own declarations
                                          # ("inherit", the default here) or refused ("deny")
    egress = ["api.example.com", "*.corp.example"]   # hosts a tool may reach
    hidden_values = false                 # the visible mode: no output hidden behind a handle (default: true)
    [agents.assistant.policy.tools.Bash]  # one tool's capability (tether.policy.Capability)
    requires_approval = true              # also: ceilings = {arg = max}, per_run, per_user,
                                          # per_user_window, on_untrusted, risk_free_args, url_args

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

from tether._agent import Agent
from tether._delegation import require_agent_prices
from tether._errors import TetherError
from tether._limits import Limits
from tether._refs import load_ref
from tether.models._pricing import UnpricedModel

AgentFactory = Callable[[str | None], Agent]


class RegistryError(TetherError, ValueError):
    """Agent configurations that cannot be used (one line saying what to change)."""


@dataclasses.dataclass
class Registry:
    """name -> factory(user) -> Agent."""

    factories: dict[str, AgentFactory]
    # agents whose file tools and Bash work in a staged copy per task (tether.staging): name -> factory
    # (user, task id) -> Agent; their tasks' changes are reviewed and applied through the API
    staged: dict[str, Callable[[str | None, str], Agent]] = dataclasses.field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.factories)

    def build(self, name: str, user: str | None, limits: dict[str, Any] | None = None,
              task_id: str | None = None) -> Agent:
        """The agent `name` acting as `user`, its limits narrowed by `limits` (a task may ask for
        less than the configuration allows, never more); a staged agent's tools work in the task's
        staged copy of the workspace (made for the task's first build, found again after)."""
        if name not in self.factories:
            raise RegistryError(f"no agent named {name!r}; agents: {', '.join(self.names()) or 'none'}")
        agent = self.staged[name](user, task_id) if task_id is not None and name in self.staged \
            else self.factories[name](user)
        agent.user = user
        agent.name = name
        if limits:
            agent.limits = narrow(agent.limits, limits)
            try:  # a task's cost ceiling over a model with no price is refused now, not in the worker
                require_agent_prices(agent)
            except UnpricedModel as exc:
                raise RegistryError(str(exc)) from exc
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
    allowed = {"model", "tools", "workspace", "instructions", "limits", "policy", "staged", "strictness", "plan",
               "options"}
    factories: dict[str, AgentFactory] = {}
    staged: dict[str, Any] = {}
    for name, cfg in agents.items():
        if not isinstance(cfg, dict):
            raise RegistryError(f"{path}: agents.{name} must be a table")
        extra = sorted(set(cfg) - allowed)
        if extra:
            raise RegistryError(f"{path}: agents.{name} has unknown keys {extra}; known: {sorted(allowed)}")
        factories[name] = _toml_factory(path, name, cfg)
        if cfg.get("staged", True) and _stages(cfg.get("tools")):
            staged[name] = _toml_factory(path, name, cfg, staged=True)
    return Registry(factories, staged)


def _stages(tools: Any) -> bool:
    """Whether a tool-set list has tools that write the workspace (files, bash, coding)."""
    from tether.cli._stage_cmd import STAGED_TOOL_SETS

    return bool({n.strip().lower() for n in str(tools or "none").split(",")} & STAGED_TOOL_SETS)


def _toml_factory(path: Path, name: str, cfg: dict[str, Any], *, staged: bool = False) -> Any:
    from tether.cli._build import CliError, build_tools
    from tether.models._resolve import ModelConfigError, parse_spec, resolve_model

    workspace = Path(cfg.get("workspace") or ".").expanduser().resolve()
    try:  # fail at start, not at the first task (the model itself is built per agent)
        limits = narrow(Limits(), cfg.get("limits") or {}) if cfg.get("limits") else Limits()
        tool_names = {t.name for t in build_tools(cfg.get("tools") or "none", workspace)}
        if cfg.get("model"):
            parse_spec(str(cfg["model"]))
        policy_from_toml(cfg.get("policy"), tool_names)
        filters = strictness_from_toml(cfg.get("strictness"))
        cls, given = agent_options(cfg)
        if isinstance(given.get("reader"), str):
            parse_spec(given["reader"])
    except (RegistryError, CliError, ModelConfigError) as exc:
        raise RegistryError(f"{path}: agents.{name}: {exc}") from exc

    def build(user: str | None, task_id: str | None = None) -> Agent:
        options = dict(given)
        try:
            stage = _task_stage(workspace, task_id) if staged and task_id is not None else None
            tools = build_tools(cfg.get("tools") or "none", workspace, stage=stage)
            model = resolve_model(cfg.get("model"))
        except (CliError, ModelConfigError) as exc:
            raise RegistryError(f"{path}: agents.{name}: {exc}") from exc
        policy = policy_from_toml(cfg.get("policy"), {t.name for t in tools})  # per run: its state is the run's
        if isinstance(options.get("reader"), str):  # a plan's quarantined reader, as a model spec
            try:
                options["reader"] = resolve_model(options["reader"])
            except ModelConfigError as exc:
                raise RegistryError(f"{path}: agents.{name}: options.reader: {exc}") from exc
        return cls(model, tools=tools, instructions=str(cfg.get("instructions") or ""), limits=limits, user=user,
                   name=name, policy=policy, input_filter=filters["input"], output_filter=filters["output"], **options)

    return build


# set by an agent's own keys, or by the service itself: not an `options` entry
_OWNED = {"model", "tools", "instructions", "limits", "user", "name", "policy", "input_filter", "output_filter",
          "executor", "durable", "step_runner", "clock", "context", "results", "pricing"}


def agent_options(cfg: dict[str, Any]) -> tuple[type[Agent], dict[str, Any]]:
    """The agent class (`PlanAgent` with `plan = true`) and the `options` table passed to it by name:
    any of its other plain options (an unknown or owned name is one clear error)."""

    plan = cfg.get("plan", False)
    if not isinstance(plan, bool):
        raise RegistryError(f"plan must be true or false, not {plan!r}")
    cls: type[Agent] = Agent
    if plan:
        from tether.plan import PlanAgent

        cls = PlanAgent
    options = cfg.get("options") or {}
    if not isinstance(options, dict):
        raise RegistryError("options must be a table of Agent options, e.g. options = { max_result_chars = 20000 }")
    known = {f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")} - _OWNED
    unknown = sorted(set(options) - known)
    if unknown:
        owned = sorted(set(unknown) & _OWNED)
        raise RegistryError(f"options {unknown} are not taken" + (f" ({owned} are set by their own keys or the service)"
                                                                  if owned else "") + f"; known: {sorted(known)}")
    return cls, dict(options)


def _task_stage(workspace: Path, task_id: str) -> Any:
    """The task's staged copy of `workspace`: made at its first build, the same one after (a worker
    that recovers the task, a resumed approval)."""
    from tether._errors import InvalidInput, NotFound
    from tether.staging import StagedWorkspace, StageExists

    try:
        return StagedWorkspace.open(task_id)
    except NotFound:
        pass
    try:
        return StagedWorkspace.create(workspace, task_id, lazy=True)
    except StageExists:  # made meanwhile by another worker
        return StagedWorkspace.open(task_id)
    except InvalidInput as exc:
        raise RegistryError(f"cannot stage {workspace} for task {task_id}: {exc}") from exc
    except OSError as exc:
        raise RegistryError(f"cannot stage {workspace} for task {task_id}: {exc.strerror or exc}") from exc


def strictness_from_toml(value: Any) -> dict[str, str | None]:
    """An agent's `strictness`: one setting for both filters, or a table {input, output}; "off" or
    absent: no filter on that side."""
    from tether.policy._safety_filter import STRICTNESS_CHOICES

    table = value if isinstance(value, dict) else {"input": value, "output": value}
    bad = sorted(set(table) - {"input", "output"})
    if bad:
        raise RegistryError(f"strictness has unknown keys {bad}; known: ['input', 'output']")
    out: dict[str, str | None] = {}
    for side in ("input", "output"):
        got = table.get(side)
        if got is not None and got not in STRICTNESS_CHOICES:
            raise RegistryError(f"strictness{'' if table is not value else '.' + side} must be one of "
                                f"{list(STRICTNESS_CHOICES)}, got {got!r}")
        out[side] = None if got in (None, "off") else str(got)
    return out


POLICY_KEYS = {"unlisted", "egress", "tools", "hidden_values"}
CAPABILITY_KEYS = {"requires_approval", "ceilings", "per_run", "per_user", "per_user_window", "on_untrusted",
                   "risk_free_args", "url_args"}


def policy_from_toml(table: Any, tool_names: set[str]) -> Any:
    """A SafetyPolicy from an agent's `policy` table (None when there is none)."""
    from tether.policy import Capabilities, Capability, EgressPolicy, SafetyPolicy

    if table is None:
        return None
    if not isinstance(table, dict):
        raise RegistryError("policy must be a table")
    extra = sorted(set(table) - POLICY_KEYS)
    if extra:
        raise RegistryError(f"policy has unknown keys {extra}; known: {sorted(POLICY_KEYS)}")
    caps = []
    tools = table.get("tools") or {}
    if not isinstance(tools, dict):
        raise RegistryError("policy.tools must be a table of [policy.tools.NAME] tables")
    for tool, spec in tools.items():
        if tool not in tool_names:
            raise RegistryError(f"policy.tools.{tool}: the agent has no such tool; its tools: {sorted(tool_names)}")
        if not isinstance(spec, dict):
            raise RegistryError(f"policy.tools.{tool} must be a table")
        bad = sorted(set(spec) - CAPABILITY_KEYS)
        if bad:
            raise RegistryError(f"policy.tools.{tool} has unknown keys {bad}; known: {sorted(CAPABILITY_KEYS)}")
        fields: dict[str, Any] = {k: tuple(v) if k in ("risk_free_args", "url_args") else v for k, v in spec.items()}
        try:
            caps.append(Capability(tool, **fields))
        except (TypeError, ValueError) as exc:
            raise RegistryError(f"policy.tools.{tool}: {exc}") from exc
    egress = table.get("egress")
    if egress is not None and (not isinstance(egress, list) or not all(isinstance(h, str) for h in egress)):
        raise RegistryError("policy.egress must be a list of host names (\"*.example.com\" for subdomains)")
    hidden_values = table.get("hidden_values", True)
    if not isinstance(hidden_values, bool):
        raise RegistryError(f"policy.hidden_values must be true (the default: untrusted outputs of the tools that "
                            f"hide are hidden values) or false (the visible mode), not {hidden_values!r}")
    try:
        capabilities = Capabilities(caps, unlisted=table.get("unlisted", "inherit"))
        allow = EgressPolicy(egress) if egress is not None else None
    except ValueError as exc:
        raise RegistryError(f"policy: {exc}") from exc
    return SafetyPolicy(capabilities=capabilities, egress=allow, hidden_values=hidden_values)
