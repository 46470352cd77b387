"""`tether serve` (the task service), `tether worker` (runs queued tasks), `tether keys add USER`."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Annotated

import typer

from tether.cli.durable_cmd import Db, database

EXIT_USAGE = 2
GlobalConcurrency = Annotated[int | None, typer.Option(
    "--global-concurrency", min=1, help="Tasks running at once across every worker on the database.")]

Agents = Annotated[str, typer.Option("--agents", help="Agent configurations: a .toml file, or module:NAME / "
                                     "file.py:NAME naming a dict of name -> function(user) -> Agent.")]


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"tether: {message}", file=sys.stderr)
    return code


def serve_cmd(db: str | None, agents: str, host: str, port: int, workers: int, grace: int,
              global_concurrency: int | None = None) -> int:
    import uvicorn

    from tether.server import RegistryError, build_app

    try:
        app = build_app(database(db), agents, workers=workers, grace_seconds=grace,
                        global_concurrency=global_concurrency)
    except RegistryError as exc:
        return _fail(str(exc))
    print(f"tether: serving on http://{host}:{port} ({workers} worker slots)", file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace)
    return 0


def worker_cmd(db: str | None, agents: str, concurrency: int, grace: int, global_concurrency: int | None = None) -> int:
    """Run queued tasks until SIGTERM/SIGINT; then stop taking work, let running steps finish for
    `grace` seconds, and leave the rest to be recovered (by this worker's next start, same id)."""
    from tether.server import RegistryError, ServiceConfig, Tasks, load_registry

    try:
        tasks = Tasks(ServiceConfig(database=database(db), workers=concurrency, global_concurrency=global_concurrency),
                      load_registry(agents))
    except RegistryError as exc:
        return _fail(str(exc))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await tasks.start()
        print(f"tether: worker {tasks.rt.config.executor_id} running up to {concurrency} tasks", file=sys.stderr)
        await stop.wait()
        print("tether: worker stopping", file=sys.stderr)
        tasks.stop(grace)

    asyncio.run(main())
    return 0


def keys_add_cmd(db: str | None, user: str, label: str) -> int:
    from tether.server.keys import ServiceTables
    from tether.store.sql import engine_url, make_engine

    engine = make_engine(engine_url(database(db)))
    try:
        key = ServiceTables(engine).add_key(user, label)
    finally:
        engine.dispose()
    print(key)
    print(f"tether: API key for {user} (shown once; only its hash is stored)", file=sys.stderr)
    return 0


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        agents: Agents,
        db: Db = None,
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
        workers: Annotated[int, typer.Option("--workers", min=0, help="Tasks this process runs at once (0: API only, "
                                             "with `tether worker` processes elsewhere).")] = 4,
        grace: Annotated[int, typer.Option(min=0, help="Seconds running steps get to finish on SIGTERM.")] = 10,
        global_concurrency: GlobalConcurrency = None,
    ) -> None:
        """Serve the task API (submit, events, confirm, cancel) over the run database."""
        raise typer.Exit(serve_cmd(db, agents, host, port, workers, grace, global_concurrency))

    @app.command("worker")
    def worker(
        agents: Agents,
        db: Db = None,
        concurrency: Annotated[int, typer.Option(min=1, help="Tasks this worker runs at once.")] = 4,
        grace: Annotated[int, typer.Option(min=0, help="Seconds running steps get to finish on SIGTERM.")] = 10,
        global_concurrency: GlobalConcurrency = None,
    ) -> None:
        """Run queued tasks from the run database (several workers may share a PostgreSQL database)."""
        raise typer.Exit(worker_cmd(db, agents, concurrency, grace, global_concurrency))

    keys = typer.Typer(help="API keys of the task service.", no_args_is_help=True)

    @keys.command("add")
    def add(user: Annotated[str, typer.Argument(help="The user the key acts as.")], db: Db = None,
            label: Annotated[str, typer.Option(help="A note to recognise the key by.")] = "") -> None:
        """Make an API key for USER and print it (once)."""
        raise typer.Exit(keys_add_cmd(db, user, label))

    app.add_typer(keys, name="keys")
