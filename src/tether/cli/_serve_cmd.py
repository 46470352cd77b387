"""`tether serve` (the task service), `tether worker` (runs queued tasks), `tether keys add|list|revoke`."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import sys
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from tether.cli._durable_cmd import Db, database

if TYPE_CHECKING:
    from tether.server._keys import ServiceTables
    from tether.server._tasks import Drained

EXIT_ERROR = 1
EXIT_USAGE = 2
GlobalConcurrency = Annotated[int | None, typer.Option(
    "--global-concurrency", min=1, help="Tasks running at once across every worker on the database.")]

Agents = Annotated[str, typer.Option("--agents", help="Agent configurations: a .toml file, or module:NAME / "
                                     "file.py:NAME naming a dict of name -> function(user) -> Agent.")]


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"tether: {message}", file=sys.stderr)
    return code


def _is_origin(text: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not (parts.path or parts.query or parts.fragment)


def serve_cmd(db: str | None, agents: str, host: str, port: int, workers: int, grace: int,
              global_concurrency: int | None = None, cors_origins: tuple[str, ...] = ()) -> int:
    """Serve until SIGTERM/SIGINT; then uvicorn closes the listener and the connections (event streams
    end; clients resume them with Last-Event-ID) while the tasks drain as in `worker_cmd`."""
    import uvicorn

    from tether.server import RegistryError, build_app

    bad = [o for o in cors_origins if o != "*" and not _is_origin(o)]
    if bad:
        return _fail(f"--cors-origin takes an origin like https://console.example.com (no path), or *: got {bad[0]!r}")
    try:
        app = build_app(database(db), agents, workers=workers, grace_seconds=grace,
                        global_concurrency=global_concurrency, cors_origins=tuple(cors_origins))
    except RegistryError as exc:
        return _fail(str(exc))
    tasks = app.state.tasks

    class Server(uvicorn.Server):
        signalled = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.signalled:
                _exit_now(1, SECOND_SIGNAL)
            self.signalled = True
            tasks.begin_drain()  # at the signal, not once the connections are closed
            super().handle_exit(sig, frame)

    try:  # bound here, before saying where it serves: uvicorn would print its raw OSError, then exit
        listener = _listen(host, port)
    except OSError as exc:
        return _fail(f"cannot serve on {host}:{port}: {_bind_error(exc, port)}", EXIT_ERROR)
    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace))
    print(f"tether: serving on http://{host}:{port} ({workers} worker slots)", file=sys.stderr)
    # uvicorn re-raises the signal it stopped on once it is done; it has been handled, so let it pass
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[listener])
    finally:
        listener.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        return _fail(f"could not serve on {host}:{port}", EXIT_ERROR)
    return _stopped(tasks.drained)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (a name, an IPv4 or an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if ":" not in host and host not in ("", "0.0.0.0"):
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


def _bind_error(exc: OSError, port: int) -> str:
    """Why a port could not be bound, and what to do, in a few words."""
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use by another process (stop it, or choose another --port)"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges; choose another --port)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "this machine has no such address (--host takes one of its own, or 0.0.0.0 for all)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    return exc.strerror or str(exc)


def worker_cmd(db: str | None, agents: str, concurrency: int, grace: int, global_concurrency: int | None = None) -> int:
    """Run queued tasks until SIGTERM/SIGINT; then take no more tasks, let the steps in flight finish
    (for at most `grace` seconds) and exit, leaving the runs pending for recovery (by this worker's next
    start with the same executor id, or another worker's janitor). A second signal exits at once."""
    from tether.server import RegistryError, ServiceConfig, Tasks, load_registry

    try:
        tasks = Tasks(ServiceConfig(database=database(db), workers=concurrency, grace_seconds=grace,
                                    global_concurrency=global_concurrency),
                      load_registry(agents))
    except RegistryError as exc:
        return _fail(str(exc))

    async def main() -> Drained:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                _exit_now(1, SECOND_SIGNAL)
            stop.set()
            tasks.begin_drain()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await tasks.start()
        print(f"tether: worker {tasks.rt.config.executor_id} running up to {concurrency} tasks", file=sys.stderr)
        await stop.wait()
        await tasks.stop_taking_work()
        print(f"tether: worker draining: taking no new tasks; {tasks.rt.steps_in_flight} steps in flight get "
              f"up to {grace} s (a second signal exits at once)", file=sys.stderr, flush=True)
        return await tasks.stop()

    return _stopped(asyncio.run(main()))


def _stopped(drained: Drained | None) -> int:
    if drained is None:
        return 0
    print(f"tether: stopped; {drained.left_pending} runs left pending for recovery"
          + (f", {drained.interrupted} steps cut short by the grace period (they run again then)"
             if drained.interrupted else ""), file=sys.stderr)
    if drained.interrupted:
        _exit_now(0)  # a tool's thread may still run: the interpreter would wait for it at exit
    return 0


def _exit_now(code: int = 1, message: str = "") -> NoReturn:
    """Exit without waiting for anything (threads, DBOS): the runs in flight stay PENDING in DBOS and
    are recovered later. May run in a signal handler, so the message goes out with a plain write."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    if message:
        os.write(2, f"tether: {message}\n".encode())
    os._exit(code)


SECOND_SIGNAL = "second signal: exiting now; the runs in flight are left pending for recovery"


@contextlib.contextmanager
def _service_tables(db: str | None) -> Iterator[ServiceTables]:
    """The service's tables on the run database, for one command."""
    from tether.server._keys import ServiceTables
    from tether.store._sql import engine_url, make_engine

    engine = make_engine(engine_url(database(db)))
    try:
        yield ServiceTables(engine)
    finally:
        engine.dispose()


def keys_add_cmd(db: str | None, user: str, label: str) -> int:
    with _service_tables(db) as tables:
        key = tables.add_key(user, label)
    print(key)
    print(f"tether: API key for {user} (shown once; only its hash is stored)", file=sys.stderr)
    return 0


def keys_list_cmd(db: str | None, user: str | None) -> int:
    import datetime as dt

    with _service_tables(db) as tables:
        rows = tables.keys(user)
    for key_id, owner, label, created in rows:
        when = dt.datetime.fromtimestamp(created, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        print(f"{key_id}  {owner}  {when}  {label}".rstrip())
    return 0


def keys_revoke_cmd(db: str | None, key: str) -> int:
    try:
        with _service_tables(db) as tables:
            key_id, user = tables.revoke(key.strip())
    except ValueError as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return 1
    print(f"tether: revoked key {key_id} of {user}; requests with it now get a 401", file=sys.stderr)
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
        cors_origin: Annotated[list[str] | None, typer.Option(
            "--cors-origin", metavar="ORIGIN",
            help="An origin whose web pages may call the API (repeatable; * for any).")] = None,
    ) -> None:
        """Serve the task API (submit, events, confirm, cancel) over the run database."""
        raise typer.Exit(serve_cmd(db, agents, host, port, workers, grace, global_concurrency,
                                   tuple(cors_origin or ())))

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

    @keys.command("list")
    def list_(user: Annotated[str | None, typer.Option(help="Only this user's keys.")] = None, db: Db = None) -> None:
        """The keys (id, user, created, label); never the keys themselves, which are not stored."""
        raise typer.Exit(keys_list_cmd(db, user))

    @keys.command("revoke")
    def revoke(key: Annotated[str, typer.Argument(help="The key, or its id from `tether keys list`.")],
               db: Db = None) -> None:
        """Delete a key: requests that carry it get a 401 from then on."""
        raise typer.Exit(keys_revoke_cmd(db, key))

    app.add_typer(keys, name="keys")
