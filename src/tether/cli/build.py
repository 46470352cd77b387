"""From `RunOptions` to an `Agent`: model, tools, limits, instructions."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.agent import Agent
from tether.cli.options import TOOL_SETS, RunOptions
from tether.limits import Limits
from tether.models.base import Model
from tether.models.resolve import ModelConfigError, resolve_model
from tether.tools import builtin
from tether.tools.base import Tool
from tether.tools.executor import Executor, Policy

if TYPE_CHECKING:
    from tether.policy import Approver


class CliError(Exception):
    """A problem with what the user asked for; printed as is, exit code 1."""


DEFAULT_INSTRUCTIONS = (
    "You are tether, an agent that completes the user's task with the tools you are given. "
    "You work in the directory {workspace}; relative paths are resolved against it. "
    "Look things up with the tools instead of guessing. When the task is done, reply with the final "
    "answer only, in exactly the form the user asked for, with no preamble."
)
NO_TOOLS_INSTRUCTIONS = "You are tether, a helpful assistant. Reply with the answer only, with no preamble."


def workspace_of(opts: RunOptions) -> Path:
    root = (opts.workspace or Path.cwd()).expanduser().resolve()
    if not root.is_dir():
        raise CliError(f"workspace {root} is not an existing directory")
    return root


def build_tools(spec: str | None, workspace: Path) -> list[Tool]:
    """Tools for a comma list of tool-set names (see TOOL_SETS); duplicates are kept once."""
    names = [n.strip().lower() for n in (spec or "coding").split(",") if n.strip()]
    if not names:
        raise CliError(f"--tools is empty; choose from: {', '.join(TOOL_SETS)}")
    unknown = [n for n in names if n not in TOOL_SETS]
    if unknown:
        raise CliError(f"unknown tool set {', '.join(map(repr, unknown))} in --tools; choose from: "
                       f"{', '.join(TOOL_SETS)}")
    if "none" in names:
        if len(names) > 1:
            raise CliError("--tools none cannot be combined with other tool sets")
        return []
    tools: list[Tool] = []
    for name in names:
        if name == "coding":
            tools += builtin.coding_tools(workspace)
        elif name == "files":
            tools += builtin.file_tools(workspace)
        elif name == "bash":
            tools.append(builtin.shell_tool(workspace))
        elif name == "calculator":
            tools.append(builtin.calculator)
    unique: dict[str, Tool] = {}
    for t in tools:
        unique.setdefault(t.name, t)
    return list(unique.values())


def build_limits(opts: RunOptions) -> Limits:
    defaults = Limits()
    return Limits(
        max_steps=opts.max_steps if opts.max_steps is not None else defaults.max_steps,
        max_tokens=opts.max_tokens,
        max_seconds=opts.max_seconds,
        max_cost_usd=opts.max_cost,
    )


def build_model(opts: RunOptions, announce: Callable[[str], None] | None = None) -> Model:
    try:
        return resolve_model(opts.model, base_url=opts.base_url, api_key=opts.api_key,
                             text_protocol=opts.text_protocol, announce=announce)
    except ModelConfigError as exc:
        raise CliError(str(exc)) from exc


def build_agent(opts: RunOptions, announce: Callable[[str], None] | None = None) -> Agent:
    """The agent the options describe. Raises CliError with a message for the user."""
    workspace = workspace_of(opts)
    tools = build_tools(opts.tools, workspace)
    limits = build_limits(opts)
    model = build_model(opts, announce)
    mcp = None
    if opts.mcp is not None:  # started after the model resolved, so a bad model leaves no server running
        from tether.cli.mcp_cmd import open_mcp, usable

        mcp = open_mcp(opts.mcp, announce)
        tools += usable(mcp, tools, announce)
    if opts.instructions is not None:
        instructions = opts.instructions
    else:
        instructions = DEFAULT_INSTRUCTIONS.format(workspace=workspace) if tools else NO_TOOLS_INSTRUCTIONS
    policy = build_policy(opts)
    # With no tools there are no results to page through, so no read_result tool either.
    executor = None if tools else Executor([], policy=policy, read_result=False)
    agent = Agent(model, tools=tools, instructions=instructions, limits=limits, policy=policy, executor=executor,
                  output_type=load_output_schema(opts.output_schema))
    if mcp is not None:
        from tether.cli.mcp_cmd import adopt

        adopt(mcp, agent.executor)
    return agent


def load_output_schema(path: Path | None) -> Any:
    """`--output-schema FILE` as an output type (a JsonSchema), or None."""
    if path is None:
        return None
    from tether.output import JsonSchema

    try:
        return JsonSchema(json.loads(path.read_text()))
    except OSError as exc:
        raise CliError(f"cannot read the output schema {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # not JSON, or not a JSON Schema
        raise CliError(f"the output schema {path} is not a valid JSON Schema: {exc}") from exc


def build_policy(opts: RunOptions) -> Policy:
    """The safety policy for CLI runs: `--yes` approves every call that asks for approval; otherwise
    ask on a terminal, and refuse when nobody can be asked (stdin is not a terminal)."""
    from tether.policy import AutoApprove, DenyAll, SafetyPolicy, TerminalApprover

    if opts.yes:
        approver: Approver = AutoApprove()
    elif sys.stdin.isatty() and sys.stderr.isatty():
        approver = TerminalApprover()
    else:
        approver = DenyAll()
    return SafetyPolicy(approver=approver)
