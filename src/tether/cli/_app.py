"""The `tether` command: `tether -p PROMPT`, `tether run`, `tether chat`, `tether models`.

stdout carries only the answer (or `--json`); progress, tool activity and errors go to stderr.
Exit codes: 0 completed, 1 error, 2 usage error, 3 budget or loop stop, 4 awaiting approval,
5 calls refused because nobody could approve them (no terminal), 6 refused or withheld by the safety
filter (--strictness), 130 cancelled (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tether._terminal import clean
from tether._trace import JsonlTraceWriter
from tether.cli import _durable_cmd as durable_cmd
from tether.cli import _eval_cmd as eval_cmd
from tether.cli import _mcp_cmd as mcp_cmd
from tether.cli import _options as o
from tether.cli import _rag_commands as rag_commands
from tether.cli import _serve_cmd as serve_cmd
from tether.cli import _stage_cmd as stage_cmd
from tether.cli._build import NO_TERMINAL, CliError, build_agent, workspace_of
from tether.cli._console import err_console, read_prompt, reporter_for
from tether.cli._mcp_tools import close_mcp
from tether.cli._progress import EXIT_CANCELLED, EXIT_ERROR, EXIT_UNASKED
from tether.cli._runner import new_run_id, report, run_turn
from tether.cli._stage_cmd import open_stage, review
from tether.events import ToolCallEnded

if TYPE_CHECKING:
    from tether import Agent

# Newer typers vendor click, older ones use the click package: find its error classes through a public name.
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

app = typer.Typer(
    name="tether",
    help="Run a bounded, tool-using LLM agent. `tether -p PROMPT` prints only the final answer on stdout.",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

PromptOption = Annotated[str | None, typer.Option(
    "--prompt", "-p", help="Run this task and print only the final answer on stdout ('-' reads stdin).",
    show_default=False)]


def _fail(console: Console, message: str, code: int = EXIT_ERROR) -> int:
    console.print(f"tether: {clean(message)}", style="red", markup=False, highlight=False, soft_wrap=True)
    return code


def open_trace(opts: o.RunOptions) -> JsonlTraceWriter | None:
    if opts.trace is None:
        return None
    folder = opts.trace.expanduser().absolute().parent
    if not folder.is_dir():  # a typo in the path should not quietly create directories
        raise CliError(f"cannot write the trace file {opts.trace}: the directory {folder} does not exist")
    try:
        return JsonlTraceWriter(opts.trace)
    except OSError as exc:
        raise CliError(f"cannot write the trace file {opts.trace}: {exc}") from exc


def execute(opts: o.RunOptions, prompt: str, db: str | None = None) -> int:
    """One run, start to exit code; recorded in the run store (`db`, else the default) unless --no-store."""
    console = err_console()
    reporter = reporter_for(opts, console)
    run_id = new_run_id()
    stage = None
    try:
        text = read_prompt(prompt)
        notices: list[str] = []
        if not opts.plan:  # the run's writes land in a staged copy of its workspace, reviewed at the end
            stage = open_stage(opts, workspace_of(opts), run_id)
        agent = build_agent(opts, announce=reporter.announce, pause=reporter.paused, notices=notices, stage=stage)
        trace = open_trace(opts)
    except CliError as exc:
        if stage is not None:
            stage.remove()
        return _fail(console, str(exc), exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before the run started (reading stdin, loading a model)
        if stage is not None:
            stage.remove()
        return _fail(console, "interrupted before the run started", EXIT_CANCELLED)
    if opts.plan:
        return _execute_plan(agent, text, opts, reporter, console)
    from tether.cli._record import recorder

    keeper = recorder(opts.no_store, db, console)
    if keeper is not None:
        keeper.open_soon()
    shown = console.is_terminal or opts.verbose or opts.yes
    if shown:
        # Up front where it can matter: to a person, or with --yes (unconfined commands then run unasked).
        for line in notices:
            reporter.announce(line)
    try:
        result = asyncio.run(run_turn(agent, text, reporter=reporter, trace=trace, run_id=run_id))
    except KeyboardInterrupt:
        return _fail(console, "interrupted", EXIT_CANCELLED)
    except Exception as exc:  # a bug, not a run outcome: the loop turns run failures into results
        if opts.verbose:
            console.print_exception()
        return _fail(console, f"internal error: {type(exc).__name__}: {exc}")
    finally:
        if trace is not None:
            trace.close()
        if agent.executor is not None:
            agent.executor.close()
            close_mcp(agent.executor)
    if not shown and any(isinstance(e, ToolCallEnded) and e.name == "Bash" for e in result.events):
        for line in notices:  # otherwise once the run asked for Bash: why those calls were refused
            reporter.announce(line)
    code = report(result, reporter, as_json=opts.json, as_output=opts.output_schema is not None, raw=opts.raw)
    unasked = [e for e in result.events if isinstance(e, ToolCallEnded) and e.decision == f"denied:{NO_TERMINAL}"]
    if unasked:
        # honest about what did not happen: the answer may say it did
        _fail(console, f"{len(unasked)} call{'s' if len(unasked) != 1 else ''} needed approval and nobody could be "
              "asked (no terminal), so they did not run; the answer may describe work that was not done. Run on a "
              "terminal, with --allow RULE, or --yes. Refused: " + ", ".join(
                  f"{e.name}({_short(e.arguments)})" for e in unasked[:5]))
        code = code or EXIT_UNASKED
    if keeper is not None:  # after the answer is out: the store never delays it
        keeper.record(result, text)
        keeper.close()
    if stage is not None:
        review(stage, opts, console)
    return code


def _short(arguments: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return text if len(text) <= 80 else text[:77] + "..."


def _execute_plan(agent: Agent[Any], text: str, opts: o.RunOptions, reporter: Any, console: Console) -> int:
    """One request in plan mode: the agent's model plans (and reads, with no tools), its tools run
    through the executor, its policy's approver is asked where a per-argument policy says so."""
    import dataclasses
    import json as json_module

    from tether.plan import PlanMode
    from tether.policy import DenyAll

    if getattr(agent.model, "tiny", False):  # the embedded model says so itself (LocalModel.tiny)
        return _fail(console, "plan mode needs a model that writes code; the embedded model cannot. Set "
                     "OPENAI_API_KEY, OPENROUTER_API_KEY or ANTHROPIC_API_KEY, or --model.")
    approver = getattr(agent.policy, "approver", None) or DenyAll()
    mode = PlanMode(agent.model, agent.tools, reader=agent.model, approver=approver, user=agent.user,
                    max_tokens=opts.max_tokens, max_cost_usd=opts.max_cost)
    try:
        result = asyncio.run(mode.arun(text))
    except KeyboardInterrupt:
        return _fail(console, "interrupted", EXIT_CANCELLED)
    finally:
        if agent.executor is not None:
            agent.executor.close()
            close_mcp(agent.executor)
    if opts.json:
        body = {"answer": result.answer, "answer_sources": result.answer_sources, "stop_reason": result.stop_reason,
                "plans": result.plans, "errors": result.errors, "calls": [dataclasses.asdict(c) for c in result.calls],
                "usage": dataclasses.asdict(result.usage)}
        typer.echo(json_module.dumps(body, ensure_ascii=False, default=str))
    elif result.completed:
        typer.echo(result.answer)
    else:
        reporter.announce(result.answer)
    return 0 if result.completed else 1


def execute_chat(opts: o.RunOptions) -> int:
    from tether.cli._chat import chat

    console = err_console()
    reporter = reporter_for(opts, console)
    notices: list[str] = []
    stage = None
    try:
        stage = open_stage(opts, workspace_of(opts), new_run_id())  # one staged view for the conversation
        agent = build_agent(opts, announce=reporter.announce, pause=reporter.paused, notices=notices, stage=stage)
        trace = open_trace(opts)
    except CliError as exc:
        if stage is not None:
            stage.remove()
        return _fail(console, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        if stage is not None:
            stage.remove()
        return _fail(console, "interrupted", EXIT_CANCELLED)
    for line in notices:  # a conversation: said once it starts
        reporter.announce(line)
    from tether.cli._record import recorder

    keeper = recorder(opts.no_store, None, console)  # each turn is a run of its own in the store
    if keeper is not None:
        keeper.open_soon()

    def after_turn(interactive: bool) -> None:  # on a terminal, each turn's changes are reviewed after its answer
        if stage is not None and interactive:
            review(stage, opts, console)

    try:
        return chat(agent, reporter, as_json=opts.json, trace=trace, raw=opts.raw,
                    on_turn=keeper.record if keeper is not None else None, after_turn=after_turn)
    except KeyboardInterrupt:
        return _fail(console, "interrupted", EXIT_CANCELLED)
    finally:
        if keeper is not None:
            keeper.close()
        if trace is not None:
            trace.close()
        if agent.executor is not None:
            agent.executor.close()
            close_mcp(agent.executor)
        if stage is not None:
            review(stage, opts, console, interactive=False)  # what is left: said once, kept staged


def _options(**values: object) -> o.RunOptions:
    for name in ("env", "protect", "sandbox_read", "allow"):  # repeated options: a tuple, None when not given
        given = values.get(name)
        values[name] = tuple(str(v) for v in given) if isinstance(given, list) and given else None
    return o.RunOptions(**values)  # type: ignore[arg-type]


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    prompt: PromptOption = None,
    model: o.Model = None,
    base_url: o.BaseUrl = None,
    api_key: o.ApiKey = None,
    max_steps: o.MaxSteps = None,
    max_tokens: o.MaxTokens = None,
    max_seconds: o.MaxSeconds = None,
    model_timeout: o.ModelTimeout = None,
    max_cost: o.MaxCost = None,
    strictness: o.Strictness = None,
    tools: o.Tools = None,
    workspace: o.Workspace = None,
    json: o.Json = False,
    trace: o.Trace = None,
    text_protocol: o.TextProtocol = None,
    instructions: o.Instructions = None,
    yes: o.Yes = False,
    allow_net: o.AllowNet = False,
    env: o.Env = None,
    protect: o.Protect = None,
    sandbox_read: o.SandboxRead = None,
    raw: o.Raw = False,
    verbose: o.Verbose = False,
    quiet: o.Quiet = False,
    output_schema: o.OutputSchema = None,
    mcp: o.Mcp = None,
    compact: o.Compact = False,
    plan: o.Plan = False,
    no_stage: o.NoStage = False,
    apply: o.Apply = False,
    allow: o.Allow = None,
    no_store: o.NoStore = False,
    show_outputs: o.ShowOutputs = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """Run a bounded, tool-using LLM agent.

    `tether -p "PROMPT"` runs one task and prints only the final answer on stdout. Exit codes: 0
    completed, 1 error, 2 usage error, 3 budget or loop stop, 4 awaiting approval, 5 calls refused for
    want of a terminal, 6 refused or withheld by the safety filter (--strictness), 130 cancelled.
    """
    if version:
        from tether import __version__

        typer.echo(f"tether {__version__}")
        raise typer.Exit(0)
    opts = _options(model=model, base_url=base_url, api_key=api_key, max_steps=max_steps, max_tokens=max_tokens,
                    strictness=strictness,
                    max_seconds=max_seconds, model_timeout=model_timeout, max_cost=max_cost, tools=tools,
                    workspace=workspace, json=json, trace=trace, text_protocol=text_protocol,
                    instructions=instructions, yes=yes, allow_net=allow_net, env=env, protect=protect, sandbox_read=sandbox_read, raw=raw, verbose=verbose, quiet=quiet,
                    output_schema=output_schema, mcp=mcp, compact=compact, plan=plan, no_stage=no_stage,
                    apply=apply, allow=allow, no_store=no_store, show_outputs=show_outputs)
    ctx.obj = opts
    if ctx.invoked_subcommand is not None:
        if prompt is not None:
            raise typer.BadParameter("-p runs a task by itself; do not combine it with a command", param_hint="-p")
        return
    if prompt is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    raise typer.Exit(execute(opts, prompt))


@app.command("run")
def run_command(
    ctx: typer.Context,
    prompt: Annotated[str | None, typer.Argument(help="The task; '-' or piped stdin reads it from stdin.",
                                                 show_default=False)] = None,
    model: o.Model = None,
    base_url: o.BaseUrl = None,
    api_key: o.ApiKey = None,
    max_steps: o.MaxSteps = None,
    max_tokens: o.MaxTokens = None,
    max_seconds: o.MaxSeconds = None,
    model_timeout: o.ModelTimeout = None,
    max_cost: o.MaxCost = None,
    strictness: o.Strictness = None,
    tools: o.Tools = None,
    workspace: o.Workspace = None,
    json: o.Json = False,
    trace: o.Trace = None,
    text_protocol: o.TextProtocol = None,
    instructions: o.Instructions = None,
    yes: o.Yes = False,
    allow_net: o.AllowNet = False,
    env: o.Env = None,
    protect: o.Protect = None,
    sandbox_read: o.SandboxRead = None,
    raw: o.Raw = False,
    verbose: o.Verbose = False,
    quiet: o.Quiet = False,
    output_schema: o.OutputSchema = None,
    mcp: o.Mcp = None,
    compact: o.Compact = False,
    plan: o.Plan = False,
    no_stage: o.NoStage = False,
    apply: o.Apply = False,
    allow: o.Allow = None,
    no_store: o.NoStore = False,
    show_outputs: o.ShowOutputs = False,
    durable: Annotated[bool, typer.Option("--durable", help="Checkpoint every step (resume with `tether resume`; "
                                          "approvals wait for `tether approve`).")] = False,
    db: durable_cmd.Db = None,
) -> None:
    """Run one task and print only its final answer (same as `tether -p PROMPT`)."""
    opts = _root_options(ctx).merge(_options(
        model=model, base_url=base_url, api_key=api_key, max_steps=max_steps, max_tokens=max_tokens,
        strictness=strictness,
        max_seconds=max_seconds, model_timeout=model_timeout, max_cost=max_cost, tools=tools, workspace=workspace,
        json=json, trace=trace, text_protocol=text_protocol, instructions=instructions, yes=yes, allow_net=allow_net,
        env=env, protect=protect, sandbox_read=sandbox_read, raw=raw, verbose=verbose, quiet=quiet, output_schema=output_schema, mcp=mcp, compact=compact,
        plan=plan, no_stage=no_stage, apply=apply, allow=allow, no_store=no_store, show_outputs=show_outputs))
    if durable and opts.plan and opts.yes:  # a durable plan's approvals park the run for `tether approve`
        raise typer.BadParameter("a durable plan run parks its approvals for `tether approve`; --yes does not "
                                 "apply: drop --yes (or --durable)", param_hint="--yes")
    if prompt is None:
        if sys.stdin.isatty():
            raise typer.BadParameter("give the task as an argument, or '-' / a pipe to read it from stdin",
                                     param_hint="PROMPT")
        prompt = "-"
    raise typer.Exit(durable_cmd.execute_durable(opts, prompt, db) if durable else execute(opts, prompt, db))


@app.command("chat")
def chat_command(
    ctx: typer.Context,
    model: o.Model = None,
    base_url: o.BaseUrl = None,
    api_key: o.ApiKey = None,
    max_steps: o.MaxSteps = None,
    max_tokens: o.MaxTokens = None,
    max_seconds: o.MaxSeconds = None,
    model_timeout: o.ModelTimeout = None,
    max_cost: o.MaxCost = None,
    strictness: o.Strictness = None,
    tools: o.Tools = None,
    workspace: o.Workspace = None,
    json: o.Json = False,
    trace: o.Trace = None,
    text_protocol: o.TextProtocol = None,
    instructions: o.Instructions = None,
    yes: o.Yes = False,
    allow_net: o.AllowNet = False,
    env: o.Env = None,
    protect: o.Protect = None,
    sandbox_read: o.SandboxRead = None,
    raw: o.Raw = False,
    verbose: o.Verbose = False,
    quiet: o.Quiet = False,
    mcp: o.Mcp = None,
    compact: o.Compact = False,
    no_stage: o.NoStage = False,
    apply: o.Apply = False,
    allow: o.Allow = None,
    no_store: o.NoStore = False,
    show_outputs: o.ShowOutputs = False,
) -> None:
    """A conversation: each line of stdin is a turn (/exit quits, /reset forgets). Limits apply per turn."""
    opts = _root_options(ctx).merge(_options(
        model=model, base_url=base_url, api_key=api_key, max_steps=max_steps, max_tokens=max_tokens,
        strictness=strictness,
        max_seconds=max_seconds, model_timeout=model_timeout, max_cost=max_cost, tools=tools, workspace=workspace,
        json=json, trace=trace, text_protocol=text_protocol, instructions=instructions, yes=yes, allow_net=allow_net,
        env=env, protect=protect, sandbox_read=sandbox_read, raw=raw, verbose=verbose, quiet=quiet, mcp=mcp, compact=compact,
        no_stage=no_stage, apply=apply, allow=allow, no_store=no_store, show_outputs=show_outputs))
    if opts.plan:
        raise typer.BadParameter("plan mode runs one request (tether --plan -p PROMPT), not a chat", param_hint="--plan")
    raise typer.Exit(execute_chat(opts))


@app.command("models")
def models_command(ctx: typer.Context) -> None:
    """List the models this machine can use (endpoints, the embedded model, GGUF files), the time limits
    a run gets, and whether Bash is sandboxed."""
    from tether.cli._models_cmd import show_models

    show_models(Console(soft_wrap=True, emoji=False), opts=_root_options(ctx))


@app.command("doctor")
def doctor_command(
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Send each configured model one real "
                                        "one-token request, and the OTLP collector one span (default: on).")] = True,
) -> None:
    """Check the sandbox, the models and keys configured (one real request each), the embedded model, the
    run store and telemetry; exit 1 when a configured part is broken."""
    from tether._terminal import clean
    from tether.cli._doctor_cmd import doctor

    raise typer.Exit(doctor(lambda line: typer.echo(clean(line)), probe=probe))


def _root_options(ctx: typer.Context) -> o.RunOptions:
    parent = ctx.parent
    obj = parent.obj if parent is not None else None
    return obj if isinstance(obj, o.RunOptions) else o.RunOptions()


rag_commands.register(app)  # `ingest`, `search`, `ask`, `eval-retrieval` (their heavy imports happen per command)
durable_cmd.register(app)  # `resume`, `approve`, `cancel`, `runs` (DBOS is imported per command)
mcp_cmd.register(app)  # `mcp-serve`, `mcp-tools`
eval_cmd.register(app)  # `eval`
serve_cmd.register(app)  # `serve`, `worker`, `keys add|list|revoke`
stage_cmd.register(app)  # `diff`, `apply`, `discard`, `undo`, `staged`


def _telemetry_from_env() -> None:
    """Spans to OTEL_EXPORTER_OTLP_ENDPOINT when it is set (docs/telemetry.md); nothing otherwise."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return  # the common case costs one lookup, and no import
    from tether.telemetry._otel import TelemetryUnavailable, instrument_from_env

    try:
        instrument_from_env()
    except TelemetryUnavailable as exc:
        _fail(err_console(), f"{exc}; running without telemetry")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `tether` script and of `python -m tether`: every bad input ends in one
    line on stderr and a non-zero exit code, never a traceback."""
    from tether._start import ctrl_c_is_main_s

    ctrl_c_is_main_s()  # start-up is over: Ctrl-C is a KeyboardInterrupt again, answered below
    try:
        _telemetry_from_env()  # inside: a Ctrl-C while telemetry's modules import is answered too
        code = app(args=argv, prog_name="tether", standalone_mode=False)
    except UsageError as exc:  # exit 2: a typo, not a failed run
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "tether"
        _fail(err_console(), f"{exc.format_message()} (see '{where} --help')")  # type: ignore[attr-defined]
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except ClickException as exc:
        _fail(err_console(), exc.format_message())  # type: ignore[attr-defined]
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except (typer.Abort, KeyboardInterrupt):
        _fail(err_console(), "interrupted")
        sys.exit(EXIT_CANCELLED)
    except BrokenPipeError:  # whoever read stdout went away (`tether -p ... | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush is quiet
        sys.exit(EXIT_ERROR)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "execute", "main"]
