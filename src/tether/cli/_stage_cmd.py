"""Staged runs on the command line: the run's view, the one review at its end, and the commands that
act on a stage later (`tether diff`, `tether apply`, `tether discard`, `tether undo`, `tether staged`).

A `tether -p` run with file tools or Bash works in a staged copy of its workspace (tether.staging).
At the end the person sees one summary and applies all, some or none; code that runs later is shown
apart and asked about one by one. Without a terminal the changes stay staged and stderr says how to
apply them; `--apply` applies what is not code run later, `--yes` applies everything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tether._errors import InvalidInput, NotFound, OperationFailed
from tether._terminal import clean
from tether.cli import _options as o
from tether.cli._console import err_console
from tether.cli._errors import CliError
from tether.staging import Change, StagedWorkspace, stages_dir

STAGED_TOOL_SETS = {"coding", "files", "bash"}
MAX_SUMMARY_LINES = 40
Ask = Callable[[str], str]
Paths = Annotated[list[str] | None, typer.Argument(help="Only these paths (a directory: what is under it).",
                                                  show_default=False)]


def staging_wanted(opts: o.RunOptions, env: dict[str, str] | None = None) -> bool:
    """Whether this run works in a staged view: it has file tools or Bash, and neither --no-stage nor
    TETHER_STAGE=off says otherwise."""
    env = dict(os.environ) if env is None else env
    if opts.no_stage or env.get("TETHER_STAGE", "").strip().lower() in ("0", "off", "no", "false"):
        return False
    names = {n.strip().lower() for n in (opts.tools or "coding").split(",")}
    return bool(names & STAGED_TOOL_SETS)


def open_stage(opts: o.RunOptions, workspace: Path, run_id: str) -> StagedWorkspace | None:
    """The run's stage (None when the run does not stage). Raises CliError with one line. Where no stage
    can be made (a read-only or full data directory) the run goes on unstaged, said on stderr: its
    effects then ask after an untrusted read, as with --no-stage."""
    if not staging_wanted(opts):
        return None
    try:
        return StagedWorkspace.create(workspace, run_id, lazy=True)  # copied at the first write: reading is free
    except InvalidInput as exc:
        raise CliError(str(exc)) from exc
    except OSError as exc:
        where = exc.filename or stages_dir()
        err_console().print(f"tether: cannot make a stage in {where} ({exc.strerror or exc}); this run writes the "
                            "workspace directly and asks before effects after an untrusted read (set TETHER_HOME "
                            "to a writable directory to stage)", style="yellow", markup=False, highlight=False,
                            soft_wrap=True)
        return None


def summary_lines(changes: Sequence[Change]) -> list[str]:
    """What the review shows: the plain changes, then the code that runs later, each group's reason once."""
    plain = [c for c in changes if not c.runs_later]
    later = [c for c in changes if c.runs_later]
    lines = [c.describe() for c in plain[:MAX_SUMMARY_LINES]]
    if len(plain) > MAX_SUMMARY_LINES:
        lines.append(f"  ... and {len(plain) - MAX_SUMMARY_LINES} more (tether diff RUN shows them all)")
    if later:
        lines.append("Code that runs later, outside the sandbox (each needs its own yes):")
        for reason, group in _by_reason(later):
            lines.append(f"  ! {reason}:")
            lines += [f"      {c.describe()}" for c in group[:8]]
            if len(group) > 8:
                lines.append(f"      ... and {len(group) - 8} more")
    return lines


def _by_reason(changes: Sequence[Change]) -> list[tuple[str, list[Change]]]:
    groups: dict[str, list[Change]] = {}
    for c in changes:
        groups.setdefault(c.runs_later or "", []).append(c)
    return list(groups.items())


def how_to_apply(stage: StagedWorkspace) -> str:
    rid = stage.run_id
    return (f"review with `tether diff {rid}`, apply with `tether apply {rid} [PATHS]`, "
            f"drop with `tether discard {rid}`")


def review(stage: StagedWorkspace, opts: o.RunOptions, console: Console, *, ask: Ask | None = None,
           interactive: bool | None = None) -> None:
    """The one review at the end of a run: apply all / some / none (on a terminal), else per
    --apply / --yes, else keep the changes staged and say how to apply them."""
    changes = stage.pending()
    if not changes:
        if not stage.changes():
            stage.remove()
        return
    say = _printer(console)
    plain = [c for c in changes if not c.runs_later]
    later = [c for c in changes if c.runs_later]
    if interactive is None:
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
    if opts.yes or (opts.apply and not interactive):
        chosen = [c.path for c in plain] + ([c.path for c in later] if opts.yes else [])
        report = stage.apply(chosen) if chosen else None
        done = len(report.done) if report else 0
        say(f"tether: applied {done} staged change{'s' if done != 1 else ''} of run {stage.run_id} to "
            f"{stage.workspace} (undo: `tether undo {stage.run_id}`)")
        _say_skipped(say, report.skipped if report else {})
        if later and not opts.yes:
            say(f"tether: {len(later)} change(s) that run later stay staged; {how_to_apply(stage)}")
            for line in summary_lines(later):
                say("  " + line)
        return
    if not interactive:
        say(f"tether: {len(changes)} change{'s' if len(changes) != 1 else ''} staged by run {stage.run_id}, "
            f"not applied to {stage.workspace}; {how_to_apply(stage)}")
        for line in summary_lines(changes):
            say("  " + line)
        return
    if ask is None:
        from tether.cli._build import ask_on_stderr  # typeahead dropped first; stdout keeps only the answer

        ask = ask_on_stderr
    ask = _eof_is_no(ask)

    say(f"Changes staged by this run ({stage.run_id}), not yet in {stage.workspace}:")
    for line in summary_lines(changes):
        say("  " + line)
    chosen: list[str] = []
    while True:
        answer = ask("Apply? [a]ll, [s]ome, [n]one, [v]iew the diff, [k]eep staged: ").strip().lower()
        if answer in ("v", "view"):
            for line in stage.diff().splitlines():
                say(line)
            continue
        if answer in ("a", "all", "y", "yes"):
            chosen = [c.path for c in plain]
        elif answer in ("s", "some"):
            chosen = [c.path for c in plain if _yes(ask(f"  apply {c.describe()}? [y/N] "))]
        elif answer in ("n", "none"):
            stage.discard()
            say(f"tether: discarded run {stage.run_id}'s changes")
            return
        elif answer in ("k", "keep", ""):
            say(f"tether: kept staged; {how_to_apply(stage)}")
            return
        else:
            continue
        break
    for c in later:  # each one its own question, never part of "all"
        if _yes(ask(f"  apply {c.describe()}, which runs later ({c.runs_later})? [y/N] ")):
            chosen.append(c.path)
    report = stage.apply(chosen) if chosen else None
    done = len(report.done) if report else 0
    say(f"tether: applied {done} change{'s' if done != 1 else ''} (undo: `tether undo {stage.run_id}`)")
    _say_skipped(say, report.skipped if report else {})
    left = len(changes) - done
    if left:
        say(f"tether: {left} change{'s' if left != 1 else ''} left staged; {how_to_apply(stage)}")


def _eof_is_no(ask: Ask) -> Ask:
    """`ask`, with the end of input answering "" (keep staged, or no)."""
    def asking(prompt: str) -> str:
        try:
            return ask(prompt)
        except EOFError:
            return ""
    return asking


def _yes(answer: str) -> bool:
    return answer.strip().lower() in ("y", "yes")


def _say_skipped(say: Callable[[str], None], skipped: dict[str, str]) -> None:
    for path, why in skipped.items():
        say(f"  not applied: {path}: {why}")


def _printer(console: Console) -> Callable[[str], None]:
    def say(line: str) -> None:
        console.print(clean(line), markup=False, highlight=False, soft_wrap=True)
    return say


# ---- commands on a stage after its run -------------------------------------------------------------


def _stage(run_id: str) -> StagedWorkspace:
    try:
        return StagedWorkspace.open(run_id)
    except (NotFound, OperationFailed) as exc:
        raise CliError(str(exc)) from exc


def _run(body: Callable[[], int]) -> int:
    try:
        return body()
    except (CliError, InvalidInput) as exc:
        err_console().print(f"tether: {clean(str(exc))}", style="red", markup=False, highlight=False, soft_wrap=True)
        return 1


def register(app: typer.Typer) -> None:
    """Add `diff`, `apply`, `discard`, `undo` and `staged` to the `tether` command."""

    @app.command("diff")
    def diff_cmd(run_id: Annotated[str, typer.Argument(help="The run whose staged changes to show.")],
                 paths: Paths = None) -> None:
        """Show a run's staged changes as a unified diff (code that runs later is marked)."""
        def body() -> int:
            stage = _stage(run_id)
            text = stage.diff(paths)
            typer.echo(clean(text) if text else f"run {run_id} has no staged changes")
            return 0
        raise typer.Exit(_run(body))

    @app.command("apply")
    def apply_cmd(run_id: Annotated[str, typer.Argument(help="The run whose staged changes to apply.")],
                  paths: Paths = None) -> None:
        """Apply a run's staged changes to its workspace: all but code that runs later, or the PATHS named
        (naming a change that runs later applies it). Undo with `tether undo RUN`."""
        def body() -> int:
            stage = _stage(run_id)
            report = stage.apply(paths)
            say = _printer(err_console())
            say(f"tether: applied {len(report.done)} change(s) of run {run_id} to {stage.workspace}")
            _say_skipped(say, report.skipped)
            return 0 if report.done or not report.skipped else 1
        raise typer.Exit(_run(body))

    @app.command("discard")
    def discard_cmd(run_id: Annotated[str, typer.Argument(help="The run whose staged changes to drop.")]) -> None:
        """Drop a run's staged changes (what was applied stays; `tether undo` reverts it)."""
        def body() -> int:
            _stage(run_id).discard()
            _printer(err_console())(f"tether: discarded run {run_id}'s staged changes")
            return 0
        raise typer.Exit(_run(body))

    @app.command("undo")
    def undo_cmd(run_id: Annotated[str, typer.Argument(help="The run whose applied changes to revert.")]) -> None:
        """Revert what `tether apply` (or the end-of-run review) applied for a run, as a whole: nothing is
        reverted when a path was changed since."""
        def body() -> int:
            report = _stage(run_id).undo()
            say = _printer(err_console())
            if report.skipped:
                say(f"tether: nothing undone: {len(report.skipped)} path(s) changed since run {run_id} was applied")
                _say_skipped(say, report.skipped)
                return 1
            say(f"tether: reverted {len(report.done)} path(s) of run {run_id}")
            return 0
        raise typer.Exit(_run(body))

    @app.command("staged")
    def staged_cmd(limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many to list.")] = 20) -> None:
        """List staged runs, newest first: run id, status, workspace, number of changes."""
        stages = StagedWorkspace.all()[:limit]
        if not stages:
            typer.echo("no staged runs")
            return
        for s in stages:
            count = len(s.pending()) if s.status in ("staged", "partly applied") else 0
            typer.echo(clean(f"{s.run_id}  {s.status:<15} {count:>4} change(s)  {s.workspace}"))


__all__ = ["open_stage", "register", "review", "staging_wanted", "summary_lines"]
