"""From `RunOptions` to an `Agent`: model, tools, limits, instructions."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether._agent import Agent
from tether._limits import Limits
from tether._loop import ContextBuilder, FullHistory
from tether._terminal import CleanWriter, flush_typeahead, show_approval
from tether.cli._errors import CliError as CliError  # re-exported: the CLI's commands raise it from here
from tether.cli._mcp_tools import adopt, open_mcp, usable
from tether.cli._options import TOOL_SETS, RunOptions
from tether.cli._user_tools import ToolImportError, import_tools, is_reference
from tether.models._base import Model
from tether.models._pricing import Pricing, UnpricedModel, require_prices
from tether.models._resolve import ModelConfigError, resolve_model
from tether.models._retry import DEFAULT_DEADLINE
from tether.tools import builtin
from tether.tools._base import Tool
from tether.tools._executor import Executor, Policy

if TYPE_CHECKING:
    from tether.policy import ApprovalDecision, ApprovalRequest, Approver
    from tether.staging import StagedWorkspace

DEFAULT_MAX_STEPS = 60  # a CLI run's model calls unless --max-steps: a 24-file change fits (library: Limits' 20)
DEFAULT_MAX_SECONDS = 600.0  # a CLI run's wall-clock limit unless --max-seconds / TETHER_MAX_SECONDS say otherwise
Pause = Callable[[], AbstractContextManager[None]]


DEFAULT_INSTRUCTIONS = (
    "You are tether, an agent that completes the user's task with the tools you are given. "
    "You work in the directory {workspace}; relative paths are resolved against it. "
    "Look things up with the tools instead of guessing. When the task is done, reply with the final "
    "answer only, in exactly the form the user asked for, with no preamble."
)
NO_TOOLS_INSTRUCTIONS = "You are tether, a helpful assistant. Reply with the answer only, with no preamble."
# Tiny models (the embedded one) get no directory name: their grammar offers the workspace's
# files, and a path in the prompt changed their answers with the directory's name.
SMALL_MODEL_INSTRUCTIONS = "You are tether, an agent that completes the user's task with the tools you are given."


def default_instructions(model: Model, tools: list[Tool], workspace: Path) -> str:
    """The system prompt `tether` uses when the user gives none."""
    if not tools:
        return NO_TOOLS_INSTRUCTIONS
    if getattr(model, "tiny", False):
        return SMALL_MODEL_INSTRUCTIONS
    return DEFAULT_INSTRUCTIONS.format(workspace=workspace)


def workspace_of(opts: RunOptions) -> Path:
    root = (opts.workspace or Path.cwd()).expanduser().resolve()
    if not root.is_dir():
        raise CliError(f"workspace {root} is not an existing directory")
    return root


def build_tools(spec: str | None, workspace: Path, *, allow_net: bool = False, pass_env: Sequence[str] = (),
                protect: Sequence[str] = (), readable: Sequence[str] = (),
                warn: Callable[[str], None] | None = None, stage: StagedWorkspace | None = None) -> list[Tool]:
    """Tools for a comma list of tool-set names (see TOOL_SETS); duplicates are kept once. `pass_env`,
    `protect` and `readable`: Bash's extra environment variable names, read-only workspace paths and
    host paths it may read; `stage`: the run's staged view the file tools and Bash work in (tether.staging)."""
    names = [n.strip().lower() for n in (spec or "coding").split(",") if n.strip()]
    if not names:
        raise CliError(f"--tools is empty; choose from: {', '.join(TOOL_SETS)}")
    refs = [n for n in (x.strip() for x in (spec or "").split(",")) if is_reference(n)]  # as written: case kept
    names = [n for n in names if not is_reference(n)]
    unknown = [n for n in names if n not in TOOL_SETS]
    if unknown:
        raise CliError(f"unknown tool set {', '.join(map(repr, unknown))} in --tools; choose from: "
                       f"{', '.join(TOOL_SETS)}")
    if "none" in names:
        if len(names) > 1 or refs:
            raise CliError("--tools none cannot be combined with other tool sets")
        return []
    tools: list[Tool] = []
    for ref in refs:
        try:
            tools += import_tools(ref)
        except ToolImportError as exc:
            raise CliError(str(exc)) from exc
    for name in names:
        if name == "coding":
            tools += builtin.coding_tools(workspace, allow_net=allow_net, pass_env=pass_env, protect=protect,
                                          readable=readable, warn=warn, stage=stage)
        elif name == "files":
            tools += builtin.file_tools(workspace, protect=protect, stage=stage)
        elif name == "bash":
            tools.append(builtin.shell_tool(workspace, allow_net=allow_net, pass_env=pass_env,
                                            executed_later=protect, readable=readable, warn=warn, stage=stage))
        elif name == "calculator":
            tools.append(builtin.calculator)
    unique: dict[str, Tool] = {}
    for t in tools:
        unique.setdefault(t.name, t)
    return list(unique.values())


def _seconds(flag: float | None, var: str, default: float | None, env: Mapping[str, str]) -> float | None:
    """A duration from its flag, else its environment variable, else `default`; 0 means no limit."""
    value: float | None = flag
    if value is None and env.get(var, "").strip():
        try:
            value = float(env[var])
        except ValueError:
            raise CliError(f"{var}={env[var]!r} is not a number of seconds") from None
        if not value >= 0:
            raise CliError(f"{var}={env[var]!r} must be a number of seconds >= 0 (0: no limit)")
    if value is None:
        return default
    return None if value == 0 else value


def run_seconds(opts: RunOptions, env: Mapping[str, str] | None = None) -> float | None:
    """The run's wall-clock limit: --max-seconds, $TETHER_MAX_SECONDS, else DEFAULT_MAX_SECONDS (None: none)."""
    return _seconds(opts.max_seconds, "TETHER_MAX_SECONDS", DEFAULT_MAX_SECONDS, os.environ if env is None else env)


def model_deadline(opts: RunOptions, env: Mapping[str, str] | None = None) -> float | None:
    """One model call's total deadline: --model-timeout, $TETHER_MODEL_TIMEOUT, else DEFAULT_DEADLINE."""
    return _seconds(opts.model_timeout, "TETHER_MODEL_TIMEOUT", DEFAULT_DEADLINE, os.environ if env is None else env)


def build_limits(opts: RunOptions) -> Limits:
    return Limits(
        max_steps=opts.max_steps if opts.max_steps is not None else DEFAULT_MAX_STEPS,
        max_tokens=opts.max_tokens,
        max_seconds=run_seconds(opts),
        max_cost_usd=opts.max_cost,
    )


def build_pricing(env: Mapping[str, str] | None = None) -> Pricing:
    """The price table, with the prices stated in $TETHER_PRICES ('MODEL=IN,OUT;MODEL=IN,OUT', USD per
    1M input and output tokens) added."""
    text = (os.environ if env is None else env).get("TETHER_PRICES", "").strip()
    stated: dict[str, tuple[float, float]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, _, rates = item.rpartition("=")
        try:
            inp, out = (float(x) for x in rates.split(","))
        except ValueError:
            raise CliError(f"TETHER_PRICES: {item!r} is not MODEL=IN,OUT (USD per 1M input, output tokens)",
                           exit_code=2) from None
        if not name.strip() or inp < 0 or out < 0:
            raise CliError(f"TETHER_PRICES: {item!r} needs a model name and prices >= 0", exit_code=2)
        stated[name.strip()] = (inp, out)
    return Pricing().with_prices(stated)


def build_model(opts: RunOptions, announce: Callable[[str], None] | None = None) -> Model:
    deadline = model_deadline(opts)
    try:
        return resolve_model(opts.model, base_url=opts.base_url, api_key=opts.api_key,
                             text_protocol=opts.text_protocol, announce=announce, deadline=deadline)
    except ModelConfigError as exc:
        raise CliError(str(exc)) from exc


def build_agent(opts: RunOptions, announce: Callable[[str], None] | None = None, pause: Pause | None = None,
                notices: list[str] | None = None, stage: StagedWorkspace | None = None) -> Agent:
    """The agent the options describe. Raises CliError with a message for the user. `pause` is
    entered while a person is asked to approve a call (the progress spinner stops meanwhile).
    `notices` collects what the caller should say once the run starts (Bash not sandboxed), so a
    bad option is still one line. `stage`: the run's staged view (cli/_stage_cmd.py)."""
    workspace = workspace_of(opts)
    tools = build_tools(opts.tools, workspace, allow_net=opts.allow_net, pass_env=opts.env or (),
                        protect=opts.protect or (), readable=opts.sandbox_read or (),
                        warn=None if notices is None else notices.append, stage=stage)
    limits = build_limits(opts)
    model = build_model(opts, announce)
    pricing = build_pricing()
    if limits.max_cost_usd is not None:  # before any MCP server starts: a usage error, exit 2
        try:
            require_prices(model, pricing, what="--max-cost")
        except UnpricedModel as exc:
            raise CliError(str(exc), exit_code=2) from None
    mcp = None
    if opts.mcp is not None:  # started after the model resolved, so a bad model leaves no server running
        mcp = open_mcp(opts.mcp, announce)
        tools += usable(mcp, tools, announce)
    if opts.instructions is not None:
        instructions = opts.instructions
    else:
        instructions = default_instructions(model, tools, workspace)
    context: ContextBuilder = FullHistory()
    if opts.compact:
        from tether.context import Compaction

        compaction = Compaction()  # folds with the run's own model, each fold a recorded model call
        tools += compaction.tools()
        context = compaction
    policy = build_policy(opts, pause)
    # With no tools there are no results to page through, so no read_result tool either.
    executor = None if tools else Executor([], policy=policy, read_result=False)
    strictness = build_strictness(opts)
    agent = Agent(model, tools=tools, instructions=instructions, limits=limits, policy=policy, executor=executor,
                  output_type=load_output_schema(opts.output_schema), context=context, pricing=pricing,
                  input_filter=strictness, output_filter=strictness)
    if mcp is not None:
        adopt(mcp, agent.executor)
    return agent


def build_strictness(opts: RunOptions) -> str | None:
    """`--strictness` (else $TETHER_STRICTNESS) as the filters' setting; None: off."""
    from tether.policy._safety_filter import STRICTNESS_CHOICES

    value = (opts.strictness or os.environ.get("TETHER_STRICTNESS") or "off").strip().lower()
    if value not in STRICTNESS_CHOICES:
        raise CliError(f"--strictness must be one of {', '.join(STRICTNESS_CHOICES)}, got {value!r}", exit_code=2)
    if opts.plan and opts.strictness is not None and value != "off":
        raise CliError("--strictness does not apply to plan mode yet: drop --plan or --strictness", exit_code=2)
    return None if value == "off" or opts.plan else value


def load_output_schema(path: Path | None) -> Any:
    """`--output-schema FILE` as an output type (a JsonSchema), or None."""
    if path is None:
        return None
    from tether._output import JsonSchema

    try:
        return JsonSchema(json.loads(path.read_text()))
    except OSError as exc:
        raise CliError(f"cannot read the output schema {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # not JSON, or not a JSON Schema
        raise CliError(f"the output schema {path} is not a valid JSON Schema: {exc}") from exc


def build_policy(opts: RunOptions, pause: Pause | None = None) -> Policy:
    """The safety policy for CLI runs: `--yes` approves every call that asks for approval; otherwise
    ask on a terminal, and refuse when nobody can be asked (stdin is not a terminal). Untrusted outputs
    of the tools that hide are hidden values unless `--show-outputs`."""
    from tether.policy import AllowRule, AutoApprove, RuleApprover, SafetyPolicy, TerminalApprover

    class EscapingTerminalApprover(TerminalApprover):
        """The terminal approver, its question shown by `tether._terminal.show_approval` (escaped, long
        whitespace collapsed, long values cut in the middle, so what runs is what is shown)."""

        def render(self, req: ApprovalRequest) -> str:
            return show_approval(req)

    if opts.yes:
        approver: Approver = AutoApprove()
    elif sys.stdin.isatty() and sys.stderr.isatty():
        approver = PausingApprover(EscapingTerminalApprover(ask=ask_on_stderr, out=CleanWriter(sys.stderr)), pause)
    else:
        approver = NoTerminal()
    if not opts.yes:  # --allow rules, and the terminal's "allow such calls for this run" answer
        try:
            rules = [AllowRule.parse(text) for text in opts.allow or ()]
        except ValueError as exc:
            raise CliError(f"--allow: {exc}") from exc
        approver = RuleApprover(rules, approver)
    if opts.show_outputs and opts.plan:
        raise CliError("--show-outputs does not apply to plan mode (its reader keeps untrusted text from the "
                       "planner): drop --plan or --show-outputs", exit_code=2)
    # --show-outputs: the visible mode, every output in the model's context (docs/hidden_values.md)
    # the workspace's secret files (.env, key files) are known by value from the run's start
    return SafetyPolicy(approver=approver, hidden_values=not opts.show_outputs, workspace=workspace_of(opts))


NO_TERMINAL = "no-terminal"  # who denied a call that needed approval when nobody could be asked


class NoTerminal:
    """The approver of a CLI run without a terminal (and without --yes): nobody can be asked, so every
    call that needs approval is denied, and the run says so at its end (exit code 5)."""

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        from tether.policy import ApprovalDecision

        return ApprovalDecision("denied", NO_TERMINAL, "nobody can be asked: stdin is not a terminal (give --allow "
                                "RULE or --yes to approve such calls)")


def ask_on_stderr(prompt: str) -> str:
    """`input` that writes its prompt to stderr: stdout carries only the answer. Typeahead is dropped
    first: a key pressed before the question appeared does not answer it."""
    flush_typeahead(sys.stdin)
    sys.stderr.write(prompt)
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line


class PausingApprover:
    """An approver asked with the progress display paused, so the spinner never redraws over the
    question; control sequences in the request are removed before it is shown (CleanWriter)."""

    def __init__(self, inner: Approver, pause: Pause | None) -> None:
        self.inner = inner
        self.pause: Pause = pause or nullcontext

    async def request(self, req: ApprovalRequest) -> ApprovalDecision:
        with self.pause():
            return await self.inner.request(req)

    @property
    def batches(self) -> bool:
        from tether.policy._approvals import asks_in_batches

        return asks_in_batches(self.inner)

    async def request_batch(self, batch: Any) -> list[ApprovalDecision]:
        """The calls of one turn as one question (the terminal's: all, none or one by one)."""
        with self.pause():
            return await self.inner.request_batch(batch)  # type: ignore[attr-defined]  # see `batches`
