"""Durable runs on the command line: `tether run --durable`, `tether resume RUN_ID`,
`tether approve RUN_ID CALL_ID [--batch] [--deny]`, `tether cancel RUN_ID`, `tether runs [RUN_ID]`.

The database is `--db` (a SQLite path or a postgresql:// URL), else $TETHER_DB, else tether.db
under the user's data dir. A durable CLI run keeps its options (never the API key) with the run,
so `tether resume` rebuilds the same agent; a call that needs approval parks the run (exit 4)
until `tether approve` decides it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from tether._errors import NotFound, OperationFailed
from tether._terminal import clean, json_safe
from tether._types import CallDecision, StopReason
from tether.cli import _options as o
from tether.cli._console import err_console, read_prompt, reporter_for
from tether.cli._progress import EXIT_ERROR
from tether.cli._stage_cmd import open_stage, review
from tether.events import ModelCallEnded, ToolCallEnded, stored

EXIT_USAGE = 2
EXIT_CANCELLED = 130
CLI_AGENT = "cli"

Db = Annotated[str | None, typer.Option("--db", help="Run database: a SQLite path or a postgresql:// URL. "
                                        "Default: $TETHER_DB, then tether.db in the user's data dir.",
                                        show_default=False)]


def database(db: str | None) -> str | None:
    return db or os.environ.get("TETHER_DB") or None


def _err(message: str) -> int:
    print(f"tether: {message}", file=sys.stderr)
    return EXIT_ERROR


def error_line(exc: BaseException) -> str:
    """One line for an error, never a library's dump: a database error is its driver's message
    (SQLAlchemy's text adds the SQL, its parameters, which hold the prompt and the run's options,
    and a "Background on this error" link)."""
    orig = getattr(exc, "orig", None)  # sqlalchemy.exc.DBAPIError: the driver's own exception
    shown = orig if isinstance(orig, BaseException) else exc
    first = (str(shown).strip().splitlines() or [""])[0]
    return clean(f"{type(shown).__name__}: {first}"[:300])


def open_error(exc: BaseException) -> str:
    """One line for a run store that cannot be opened."""
    from tether._errors import OperationFailed

    return str(exc) if isinstance(exc, OperationFailed) else f"cannot open the run database: {error_line(exc)}"


def _config(opts: o.RunOptions) -> dict[str, Any]:
    """The options a resumed run needs to rebuild its agent (no API key, no trace file)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(opts):
        if f.name in ("api_key", "trace", "json", "verbose", "quiet"):
            continue
        value = getattr(opts, f.name)
        out[f.name] = str(value) if isinstance(value, Path) else value
    return out


def _agent(config: dict[str, Any], announce: Any = None) -> Any:
    from tether.cli._build import build_agent
    from tether.policy import ApprovalBook, PendingApprover

    paths = ("workspace", "output_schema", "mcp")
    fields: dict[str, Any] = {k: (Path(v) if k in paths and v else v) for k, v in config.items()
                              if k not in ("stage", "forked_from")}
    opts = o.RunOptions(**fields)
    stage = None
    if config.get("stage"):  # the run's staged copy of its workspace, made when it started
        from tether.staging import StagedWorkspace

        stage = StagedWorkspace.open(str(config["stage"]))
    agent = build_agent(opts, announce=announce or (lambda *_: None), stage=stage)
    policy: Any = agent.policy
    if not opts.yes and hasattr(policy, "approver"):
        policy.approver = PendingApprover(ApprovalBook())  # durable: park for `tether approve`, do not deny
    if opts.plan:
        agent = plan_agent(agent)
    agent.name = CLI_AGENT
    return agent


def plan_agent(agent: Any) -> Any:
    """The CLI's agent in plan mode (`tether run --plan --durable`): a PlanAgent over the same model, tools,
    limits and policy, its model the planner and the quarantined reader; the durable workflow runs its
    planner and reader calls and its tools as the run's steps (tether.plan.PlanAgent)."""
    from tether.cli._build import CliError
    from tether.plan import PlanAgent

    if getattr(agent.model, "tiny", False):  # the embedded model says so itself (LocalModel.tiny)
        raise CliError("plan mode needs a model that writes code; the embedded model cannot. Set OPENAI_API_KEY, "
                       "OPENROUTER_API_KEY or ANTHROPIC_API_KEY, or --model.")
    return PlanAgent(agent.model, tools=agent.tools, instructions=agent.instructions, limits=agent.limits,
                     policy=agent.policy, pricing=agent.pricing, user=agent.user, reader=agent.model,
                     executor=agent.executor)  # its MCP sessions (if any) are closed with it


def _drop_record(record: logging.LogRecord) -> bool:
    return False


def _quiet_dbos() -> None:
    """DBOS's log records stay off the terminal (a parking run's cancelled task logs a warning, for
    one): what a command has to say comes through its own lines. TETHER_DBOS_LOG_LEVEL shows them."""
    if not os.environ.get("TETHER_DBOS_LOG_LEVEL"):
        logger = logging.getLogger("dbos")
        if _drop_record not in logger.filters:
            logger.addFilter(_drop_record)


def _runtime(db: str | None) -> Any:
    from tether.durable import attach, setup

    _quiet_dbos()
    rt = setup(database(db))

    def factory(config: dict[str, Any]) -> Any:
        agent = _agent(config)
        attach(agent, rt.config)
        return agent

    rt.factories[CLI_AGENT] = factory
    return rt


async def until_parked(run_id: str, work: Any) -> Any:
    """Await `work` (the run's RunResult), unless the run parks on an approval first: then the run
    stays parked in the database (no process needed) and a RunResult saying so comes back."""
    from tether._types import RunResult, StopReason, Usage
    from tether.durable import runtime

    task = asyncio.ensure_future(work)
    store = runtime().store
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            row = store.run(run_id)
            # parked for a second (a recovered run passes through its decided waits in milliseconds)
            if not task.done() and row is not None and row.status == "awaiting_approval" and row.pending \
                    and time.time() - row.updated_at > 1.0:
                p = row.pending
                group = p.get("batch_calls") if p.get("batch") else None
                what = (f"{len(group)} calls of one batch ({p.get('batch_summary') or _call_text(p)}) await"
                        if isinstance(group, list) and len(group) > 1 else f"{_call_text(p)} awaits")
                flag = " [--batch]" if isinstance(group, list) and len(group) > 1 else ""
                print(clean(f"tether: run {run_id} is parked: {what} approval ({p.get('reason')}). "
                            f"Decide with: tether approve {run_id} {p.get('call_id')}{flag} [--deny], then: tether "
                            f"resume {run_id}"), file=sys.stderr)
                # the row's step count is written when the run ends; until then its stored model calls say it
                events = [stored(e) for e in store.events(run_id)]
                steps = max(row.steps, sum(isinstance(e, ModelCallEnded) for e in events))
                # the parked call has its event too (decision awaiting_approval): it has not run
                ran = sum(isinstance(e, ToolCallEnded) and e.decision != CallDecision.AWAITING_APPROVAL for e in events)
                return RunResult(run_id, StopReason.AWAITING_APPROVAL, "", steps=steps,
                                 usage=Usage(model_calls=steps, tool_calls=ran),
                                 error=f"parked: tether approve {run_id} {p.get('call_id')}, then tether resume {run_id}")
        return task.result()
    finally:
        if not task.done():
            task.cancel()


def execute_durable(opts: o.RunOptions, prompt: str, db: str | None, fork: Any = None) -> int:
    """`tether run --durable`: one run as a DBOS workflow, every step checkpointed. `fork`: a
    function from the new run's id to its RunState and the config keys that say what it forked
    (`tether runs fork`), instead of a fresh state from `prompt`."""
    from tether.cli._build import CliError, workspace_of
    from tether.cli._runner import report
    from tether.durable import DurableRuns, attach
    from tether.durable._runtime import teardown

    console = err_console()
    reporter = reporter_for(opts, console)
    opened = None
    stage = None
    started: str | None = None  # the run's id once it is stored
    try:
        text = read_prompt(prompt) if fork is None else prompt
        rt = _runtime(db)
        config = _config(opts)
        run_id = uuid.uuid4().hex[:12]
        forked, extra = fork(run_id) if fork is not None else (None, {})
        # reviewed when the run ends, here or at resume; plan mode writes the workspace, as without --durable
        stage = None if opts.plan else open_stage(opts, workspace_of(opts), run_id)
        if stage is not None:
            config["stage"] = stage.run_id
        agent = _agent(config, announce=reporter.announce)
        opened = agent.executor  # its MCP sessions (if any) are closed by it; attach makes a new executor
        attach(agent, rt.config)
        rt.agents.pop(CLI_AGENT, None)  # runs are rebuilt from their own options, not this agent
        runs = DurableRuns(rt)
        state = agent.start_state(text, run_id=run_id) if forked is None else forked
        rt.store.create_run(run_id, CLI_AGENT, state.user, text, config={**config, **extra})
        started = run_id
        # named once it exists (a locked database fails the line above: no id of a run never made)
        console.print(f"durable run {run_id} ({rt.url.split('@')[-1]})", style="dim", highlight=False, markup=False)
        rt._built[CLI_AGENT + json.dumps(config, sort_keys=True)] = agent
        result = asyncio.run(until_parked(run_id, runs.run(agent, state, on_event=reporter)))
    except CliError as exc:
        _drop_unused(stage)
        return _err(str(exc))
    except KeyboardInterrupt:  # Ctrl-C: this process stops; the run stays where its checkpoints are
        if started is None:
            _drop_unused(stage)
            _err("interrupted before the run started")
        else:
            _err(_interrupted_line(started))
        return EXIT_CANCELLED
    except Exception as exc:
        _drop_unused(stage)
        return _err(f"durable run failed: {error_line(exc)}")
    finally:
        teardown()
        if opened is not None:
            from tether.cli._mcp_tools import close_mcp

            close_mcp(opened)
    code = report(result, reporter, as_json=opts.json, as_output=opts.output_schema is not None)
    if stage is not None and result.stop_reason is not StopReason.AWAITING_APPROVAL:
        review(stage, opts, console)
    return code


def _drop_unused(stage: Any) -> None:
    """A run that failed to start leaves no empty stage behind."""
    if stage is not None and not stage.changes():
        stage.remove()


def _interrupted_line(run_id: str) -> str:
    """What an interrupted durable run did and how it goes on (it is not cancelled: its workflow
    stays pending, and `tether resume` continues it from its last checkpoint)."""
    from tether.durable import runtime
    from tether.store._stats import run_totals

    try:
        store = runtime().store
        spent = run_totals(store, run_id)
        ran = sum(1 for e in store.events(run_id) if e.kind == "tool_call" and e.data.get("decision") != CallDecision.AWAITING_APPROVAL)
        done = f" after {spent.model_calls} model calls and {ran} tool calls"
    except Exception:  # the database went away too: the way on is the same
        done = ""
    return (f"interrupted: durable run {run_id} stopped{done}; it is saved, not cancelled: `tether resume {run_id}` "
            f"continues it from there, `tether cancel {run_id}` ends it")


def resume_cmd(run_id: str, db: str | None, as_json: bool) -> int:
    """Recover this process's pending runs and wait for RUN_ID."""
    from tether.cli._progress import Reporter
    from tether.cli._runner import report
    from tether.durable._runtime import stored_result, teardown, wait_result

    console = err_console()
    try:
        rt = _runtime(db)
        row = rt.store.run(run_id)
        if row is None:
            return _err(f"no run {run_id!r} in {rt.url}")
        stored_config = rt.store.config(run_id)
        rt.launch()  # recovers every pending run of this executor, RUN_ID among them
        if row.status in ("completed", "stopped", "error", "cancelled"):
            result = stored_result(run_id, row.status)
        else:
            result = asyncio.run(until_parked(run_id, wait_result(run_id)))
    except Exception as exc:
        return _err(f"cannot resume {run_id}: {error_line(exc)}")
    finally:
        teardown()
    code = report(result, Reporter(console, enabled=False), as_json=as_json)
    stage_id = (stored_config or {}).get("stage")
    if stage_id and result.stop_reason is not StopReason.AWAITING_APPROVAL:
        from tether.staging import StagedWorkspace

        with contextlib.suppress(NotFound, OperationFailed):
            review(StagedWorkspace.open(str(stage_id)), o.RunOptions(), console)
    return code


def approve_cmd(run_id: str, call_id: str, deny: bool, reason: str, db: str | None, batch: bool = False) -> int:
    from tether.durable._control import ControlError, approve

    try:
        pending = approve(database(db), run_id, call_id, approved=not deny, reason=reason, batch=batch)
    except ControlError as exc:
        return _err(str(exc))
    except Exception as exc:
        return _err(f"cannot reach the run database: {error_line(exc)}")
    verb = "denied" if deny else "approved"
    calls = pending.get("batch_calls") if batch else None
    if isinstance(calls, list) and calls:
        shown = "; ".join(_call_text(c) for c in calls if isinstance(c, dict))
        print(clean(f"{verb} {len(calls)} calls of one batch in run {run_id}: {shown}"), file=sys.stderr)
        return 0
    print(clean(f"{verb} {_call_text(pending)} in run {run_id}"), file=sys.stderr)
    return 0


def _call_text(pending: dict[str, Any]) -> str:
    return f"{pending.get('tool')}({json.dumps(pending.get('arguments'), ensure_ascii=False)})"


def cancel_cmd(run_id: str, db: str | None) -> int:
    from tether.durable._control import ControlError, cancel

    try:
        before = cancel(database(db), run_id)
    except ControlError as exc:
        return _err(str(exc))
    except Exception as exc:
        return _err(f"cannot reach the run database: {error_line(exc)}")
    print(f"cancelled run {run_id} (was {before})", file=sys.stderr)
    return 0


def runs_cmd(run_id: str | None, events: bool, limit: int, as_json: bool, db: str | None) -> int:
    from tether.store import RunStore

    try:
        store = RunStore(database(db))
    except Exception as exc:
        return _err(open_error(exc))
    try:
        return _show_runs(store, run_id, events, limit, as_json)
    except Exception as exc:  # a corrupt or half-migrated database: one line, not SQLAlchemy's dump
        return _unreadable(store, exc)
    finally:
        store.close()


def _unreadable(store: Any, exc: BaseException) -> int:
    where = store.url.split("@")[-1].removeprefix("sqlite:///").removeprefix("sqlite+pysqlite:///")
    return _err(f"cannot read the run database {where}: {error_line(exc)} (`tether doctor` checks it)")


FINISHED = ("completed", "stopped", "error", "cancelled")


def _show_runs(store: Any, run_id: str | None, events: bool, limit: int, as_json: bool) -> int:
    from tether.store._stats import run_totals

    if run_id is None:
        rows = store.runs(limit=limit)
        if as_json:
            print(json_safe(json.dumps([dataclasses.asdict(r) for r in rows], ensure_ascii=False)))
        if not rows and not as_json:
            print(clean(f"no runs stored in {store.url.removeprefix('sqlite:///').split('@')[-1]}"))
        forked = store.forked_from([r.run_id for r in rows]) if not as_json else {}
        for r in rows if not as_json else ():
            answer = (r.answer or "").replace("\n", " ")
            steps = r.steps if r.status in FINISHED else run_totals(store, r.run_id).model_calls  # so far
            f = forked.get(r.run_id)
            parent = f"  (forked from {f.get('run')} at step {f.get('step')})" if f else ""
            print(clean(f"{r.run_id}  {r.status:<17} steps={steps:<3} {r.prompt[:40]!r:<44} {answer[:40]}{parent}"))
        return 0
    row = store.run(run_id)
    if row is None:
        return _err(f"no run {run_id!r}")
    if as_json:
        print(json_safe(json.dumps({**dataclasses.asdict(row), "events": [
            dataclasses.asdict(e) for e in store.events(run_id)] if events else None}, ensure_ascii=False)))
        return 0
    for key, value in dataclasses.asdict(row).items():
        print(clean(f"{key}: {value}"))
    for e in store.events(run_id) if events else ():
        print(clean(f"  [{e.step}] {e.t:8.3f}s {e.kind:<11} {json.dumps(e.data, ensure_ascii=False)}"))
    return 0


def fork_cmd(run_id: str | None, at: int | None, message: str | None, model: str | None, as_json: bool,
             db: str | None) -> int:
    """`tether runs fork RUN --at STEP`: a new durable run from step STEP of a stored CLI run (durable
    or not), with an edited last user message or another model if given, run here to its end."""
    from tether._errors import TetherError
    from tether.durable._fork import fork_state
    from tether.store import RunStore

    if not run_id or at is None:
        return _err("usage: tether runs fork RUN_ID --at STEP [--message TEXT] [--model SPEC]")
    try:
        store = RunStore(database(db))
    except Exception as exc:
        return _err(open_error(exc))
    try:
        row, state, config = store.run(run_id), store.state(run_id), store.config(run_id) or {}
    finally:
        store.close()
    if row is None:
        return _err(f"no run {run_id} is stored (`tether runs` lists them)")
    if row.agent != CLI_AGENT:
        return _err(f"run {run_id} is a run of the service's agent {row.agent!r}: fork it from the console "
                    "(its agent is built by `tether serve`, not here)")
    if state is None:
        return _err(f"run {run_id} has no stored transcript yet (it is still running): fork it once it stopped or parked")
    try:
        fork_state(state, at, run_id="check", message=message)  # a wrong step or message, said before starting
    except TetherError as exc:
        return _err(str(exc))
    # a durable run kept its options; a `tether -p` run did not: it forks with the defaults (and --model)
    fields = {k: v for k, v in config.items() if k in {f.name for f in dataclasses.fields(o.RunOptions)}}
    paths = ("workspace", "output_schema", "mcp")
    values: dict[str, Any] = {k: (Path(v) if k in paths and v else tuple(v) if isinstance(v, list) else v)
                              for k, v in fields.items()}
    opts = o.RunOptions(**values)
    if model:
        opts.model = model
    if as_json:
        opts.json = True
    print(clean(f"tether: forking run {run_id} at step {at}" + (" with its options" if fields else
                " with the default options (a `tether -p` run keeps none)")), file=sys.stderr)

    def start(new_id: str) -> tuple[Any, dict[str, Any]]:
        return fork_state(state, at, run_id=new_id, message=message), {"forked_from": {"run": run_id, "step": at}}

    prompt = message or row.prompt
    return execute_durable(opts, prompt, db, fork=start)


def stats_cmd(by: str, days: float | None, as_json: bool, db: str | None) -> int:
    """`tether runs stats`: tokens and cost of the stored runs, grouped."""
    from rich.console import Console
    from rich.table import Table

    from tether.store import RunStore
    from tether.store._stats import GROUPS, UsageRow, usage_stats

    if by not in GROUPS:
        return _err(f"--by {by}: use one of {', '.join(GROUPS)}")
    try:
        store = RunStore(database(db))
    except Exception as exc:
        return _err(open_error(exc))
    try:
        rows = usage_stats(store, by, since=time.time() - days * 86_400 if days else None)
    except Exception as exc:
        return _unreadable(store, exc)
    finally:
        store.close()
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], ensure_ascii=False))
        return 0
    table = Table(box=None, pad_edge=False)
    heads = [by, "runs", "model calls", "input tokens", "cached", "output tokens", "cost USD", "tool calls", "tool errors"]
    for i, head in enumerate(heads):
        table.add_column(head, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        table.add_row(*_stat_cells(r))
    if len(rows) > 1:
        total = UsageRow("total")
        for r in rows:
            total.add(r)
        table.add_row(*_stat_cells(total, runs=by in ("day", "agent", "run")), style="bold")
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    console.print(table if rows else "no runs stored" + (f" in the last {days:g} days" if days else ""))
    return 0


def _stat_cells(r: Any, runs: bool = True) -> list[str]:
    return [clean(r.key), f"{r.runs:,}" if runs else "", f"{r.model_calls:,}", f"{r.input_tokens:,}",
            f"{r.cached_input_tokens:,}", f"{r.output_tokens:,}", f"{r.cost_usd:.4f}", f"{r.tool_calls:,}",
            f"{r.tool_errors:,}"]


def register(app: typer.Typer) -> None:
    """Add `resume`, `approve`, `cancel` and `runs` to the `tether` command."""

    @app.command("resume")
    def resume(run_id: Annotated[str, typer.Argument(help="The run to resume.")], db: Db = None,
               json_out: Annotated[bool, typer.Option("--json", help="Print the RunResult as JSON.")] = False) -> None:
        """Resume a durable run (and every other pending run of this machine) and print its answer."""
        raise typer.Exit(resume_cmd(run_id, db, json_out))

    @app.command("approve")
    def approve(run_id: Annotated[str, typer.Argument(help="The parked run.")],
                call_id: Annotated[str, typer.Argument(help="The call it waits on (see `tether runs RUN_ID`).")],
                deny: Annotated[bool, typer.Option("--deny", help="Deny the call instead.")] = False,
                reason: Annotated[str, typer.Option("--reason", help="Why (the model sees it on a denial).")] = "",
                batch: Annotated[bool, typer.Option("--batch", help="Decide every call of the parked call's batch "
                                                    "(the calls of one turn asked as one question) at once, each "
                                                    "bound to its own arguments.")] = False,
                db: Db = None) -> None:
        """Approve (or --deny) the call a durable run (or a service task) is parked on; the run then goes on by
        itself. With --batch, the whole batch it belongs to."""
        raise typer.Exit(approve_cmd(run_id, call_id, deny, reason, db, batch))

    @app.command("cancel")
    def cancel(run_id: Annotated[str, typer.Argument(help="The run to cancel.")], db: Db = None) -> None:
        """Cancel a durable run: it stops at its next step boundary."""
        raise typer.Exit(cancel_cmd(run_id, db))

    @app.command("runs")
    def runs(run_id: Annotated[str | None, typer.Argument(help="Show this run.", show_default=False)] = None,
             fork_run: Annotated[str | None, typer.Argument(help="With `runs fork`: the run to fork.",
                                                            show_default=False)] = None,
             events: Annotated[bool, typer.Option("--events", "-e", help="Print the run's events.")] = False,
             limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many runs to list.")] = 20,
             json_out: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
             by: Annotated[str, typer.Option("--by", help="With `runs stats`: day, agent, model, tool or run.")] = "day",
             days: Annotated[float | None, typer.Option("--days", min=0, help="With `runs stats`: the last N days only.",
                                                        show_default=False)] = None,
             at: Annotated[int | None, typer.Option("--at", min=0, help="With `runs fork RUN`: the step to fork "
                                                    "from (keeps model calls 1..STEP).", show_default=False)] = None,
             message: Annotated[str | None, typer.Option("--message", help="With `runs fork`: the last user "
                                                         "message, edited.", show_default=False)] = None,
             model: Annotated[str | None, typer.Option("--model", help="With `runs fork`: another model.",
                                                       show_default=False)] = None,
             db: Db = None) -> None:
        """List stored runs (every CLI run unless --no-store, durable and service runs), newest first, or show one (with --events, its step events). `tether runs stats`:
        tokens and cost per day, agent, model, tool or run (--by). `tether runs fork RUN --at STEP [--message TEXT]
        [--model SPEC]`: a new durable run from step STEP of RUN."""
        if run_id == "fork":
            raise typer.Exit(fork_cmd(fork_run, at, message, model, json_out, db))
        if fork_run is not None or at is not None or message is not None or model is not None:
            raise typer.Exit(_err("RUN_ID, --at, --message and --model go with `tether runs fork RUN_ID --at STEP`"))
        if run_id == "stats":
            raise typer.Exit(stats_cmd(by, days, json_out, db))
        raise typer.Exit(runs_cmd(run_id, events, limit, json_out, db))
