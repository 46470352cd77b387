"""`tether eval SUITE`: run a scenario suite by replay (default), record its cassettes, or run it live.

Exit codes: 0 every scenario passed, 1 a scenario failed (or a safety violation), 2 a suite or option
that cannot be used.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tether._terminal import clean
from tether.cli._durable_cmd import Db
from tether.cli._progress import EXIT_ERROR, EXIT_OK

EXIT_USAGE = 2


def eval_cmd(suite_path: Path, model_spec: str | None, record: bool, judge_spec: str | None, json_out: Path | None,
             html_out: Path | None, compare_to: Path | None, concurrency: int | None, only: list[str]) -> int:
    from tether.evals import load_suite, run_suite
    from tether.evals._report import compare, load_report, print_table, write_html, write_json
    from tether.models._resolve import ModelConfigError, resolve_model

    err = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        suite = load_suite(suite_path)
        old = load_report(compare_to) if compare_to else None
        model = resolve_model(model_spec) if model_spec else None
        judge = resolve_model(judge_spec) if judge_spec else None
    except (ValueError, ModelConfigError) as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return EXIT_USAGE
    mode = "record" if record else ("live" if model is not None else "replay")

    def progress(row: dict) -> None:
        err.print(clean(f"  {'ok ' if row['success'] else 'FAIL'} {row['id']}"), markup=False)

    try:
        report = asyncio.run(run_suite(suite, mode=mode, model=model, judge=judge, concurrency=concurrency,
                                       only=only or None, on_done=progress))
    except ValueError as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = Console(soft_wrap=True)
    print_table(report, out if out.is_terminal else Console(soft_wrap=True, width=180))
    if json_out:
        write_json(report, json_out)
    if html_out:
        write_html(report, html_out)
    if old is not None:
        for line in compare(old, report):
            print(clean(line))
    t = report["totals"]
    return EXIT_OK if t["passed"] == t["scenarios"] and t["safety_violations"] == 0 else EXIT_ERROR


def export_cmd(run_id: str, db: str | None, out: Path) -> int:
    """`tether export-cassette RUN_ID`: a stored run as a cassette for `tether eval`."""
    from tether.cli._durable_cmd import database
    from tether.evals import cassette_from_state
    from tether.store._sql import RunStore

    store = RunStore(database(db))
    try:
        state = store.state(run_id)
    finally:
        store.close()
    if state is None:
        print(f"tether: no finished run {run_id!r} in the run database (see `tether runs`)", file=sys.stderr)
        return EXIT_USAGE
    cassette = cassette_from_state(state)
    cassette.save(out)
    print(f"tether: wrote {out} ({len(cassette.model)} model replies, {len(cassette.tools)} tool responses)",
          file=sys.stderr)
    return EXIT_OK


def register(app: typer.Typer) -> None:
    """Add `tether eval` to the app."""

    @app.command("eval")
    def evaluate(
        suite: Annotated[Path, typer.Argument(help="Suite file (TOML or YAML).", show_default=False)],
        model: Annotated[str | None, typer.Option("--model", "-m", help="Run live with this model (as for "
                                                  "`tether --model`) instead of replaying cassettes.")] = None,
        record: Annotated[bool, typer.Option("--record", help="Run the scripts (or --model) with the real tools "
                                             "and write each scenario's cassette.")] = False,
        judge_model: Annotated[str | None, typer.Option("--judge-model", help="Model for `judge` expectations.")] = None,
        json: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
        html: Annotated[Path | None, typer.Option("--html", help="Write an HTML report with charts here.")] = None,
        compare: Annotated[Path | None, typer.Option("--compare", help="An earlier --json report: show what "
                                                     "got better or worse.")] = None,
        concurrency: Annotated[int | None, typer.Option("--concurrency", min=1,
                                                        help="Scenarios at once (default: the suite's).")] = None,
        only: Annotated[list[str] | None, typer.Option("--only", help="Run only this scenario (repeatable).")] = None,
    ) -> None:
        """Run a scenario suite and report success, steps, tokens, cost, side effects and safety violations."""
        raise typer.Exit(eval_cmd(suite, model, record, judge_model, json, html, compare, concurrency, only or []))

    @app.command("export-cassette")
    def export_cassette(
        run_id: Annotated[str, typer.Argument(help="A run in the run database (`tether runs`).")],
        out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the cassette.")],
        db: Db = None,
    ) -> None:
        """Write a stored run as a cassette that a suite scenario can replay."""
        raise typer.Exit(export_cmd(run_id, db, out))
