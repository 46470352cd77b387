"""`tether doctor`: one screen on what this machine gives tether, and a non-zero exit when a part
that is configured is broken.

Checks: the Bash sandbox (bubblewrap runs a command here), the models configured in the
environment (an endpoint without a key is broken; with `probe`, each answers one real one-token
request, its tokens counted), the embedded model (loads and answers), the run store (the default
database, or $TETHER_DB, opens, takes a write, and its pages read back whole), and telemetry (with
`probe`, one span exported to the configured OTLP collector). Nothing that is merely absent fails the
check: only what is configured and does not work.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.models._resolve import configured_endpoints, local_status
from tether.store._sql import default_database_path
from tether.tools._sandbox import INSTALL_HINT, probe_bubblewrap


@dataclass(slots=True)
class Check:
    part: str
    state: str  # ok, missing (optional, not configured) or broken (configured, does not work)
    detail: str


def sandbox_check() -> Check:
    problem = probe_bubblewrap()
    if problem is None:
        return Check("sandbox", "ok", "bubblewrap runs commands confined to the workspace")
    return Check("sandbox", "missing", f"{problem}: Bash runs unconfined and every call needs approval; {INSTALL_HINT}")


def model_checks(env: Mapping[str, str], probe: bool = False) -> list[Check]:
    out = []
    for e in configured_endpoints(env):
        if e.name != "local" and not e.key_set and "localhost" not in e.base_url and "127.0.0.1" not in e.base_url:
            out.append(Check(f"model {e.name}", "broken", f"{e.default_model} at {e.base_url} has no API key "
                                                            f"(from {e.source})"))
            continue
        where = f"{e.default_model} at {e.base_url} (key {'set' if e.key_set else 'not needed'}; from {e.source})"
        problem, answered = _ask_one_token(f"{e.name}:{e.default_model}", env) if probe else (None, "")
        if problem is not None:
            out.append(Check(f"model {e.name}", "broken", f"{where}: {problem}; check the key, the base URL and the "
                                                          "model name (or --model)"))
        else:
            out.append(Check(f"model {e.name}", "ok", where + (f"; {answered}" if answered else "")))
    if not out:
        out.append(Check("models", "missing", "none configured (OPENAI_API_KEY, OPENROUTER_API_KEY, "
                                              "ANTHROPIC_API_KEY or TETHER_MODEL): tether uses the embedded model"))
    return out


PROBE_SECONDS = 20.0  # one probe's deadline: a model or collector slower than this is reported broken


def _ask_one_token(spec: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """Send `spec` one real request for one token: (problem or None, what it answered)."""
    import asyncio
    import time

    from tether._types import Message, ModelRequest
    from tether.models._resolve import resolve_model

    async def ask() -> Any:
        model = resolve_model(spec, env=env, deadline=PROBE_SECONDS)
        try:
            return await model.complete(ModelRequest([Message("user", "Reply with the word ok.")],
                                                     max_output_tokens=1))
        finally:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

    started = time.monotonic()
    try:
        reply = asyncio.run(ask())
    except Exception as exc:
        return f"a one-token request failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}", ""
    used = reply.usage.input_tokens + reply.usage.output_tokens
    return None, f"answered a one-token request in {time.monotonic() - started:.1f} s ({used} tokens)"


def telemetry_check(env: Mapping[str, str], probe: bool = False) -> Check:
    """The OTLP collector the environment names: with `probe`, one span exported to it."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return Check("telemetry", "missing", "no OTEL_EXPORTER_OTLP_ENDPOINT: spans are not exported")
    if not probe:
        return Check("telemetry", "ok", f"spans go to {endpoint}")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SpanExportResult
    except ImportError:
        return Check("telemetry", "broken", f"{endpoint} is set but the otel extra is missing: "
                                            "pip install 'tether[otel]'")
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or endpoint.rstrip("/") + "/v1/traces"
    provider = TracerProvider()
    with provider.get_tracer("tether.doctor").start_as_current_span("tether doctor") as span:
        pass
    exporter = OTLPSpanExporter(endpoint=url, timeout=PROBE_SECONDS)
    try:
        result = exporter.export([span])  # type: ignore[list-item]  # an ended SDK span is readable
    except Exception as exc:
        result, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "the collector refused it or did not answer"
    finally:
        exporter.shutdown()
    if result is SpanExportResult.SUCCESS:
        return Check("telemetry", "ok", f"one span exported to {url}")
    return Check("telemetry", "broken", f"one span could not be exported to {url} ({why}); check the "
                                        "collector and OTEL_EXPORTER_OTLP_ENDPOINT")


def encoder_check(probe: bool = False) -> Check:
    """The dense retrieval encoder (the `rag` extra): which graph runs on this CPU and why (decided
    by measurement on first use, tether.rag._encoder_path), and with `probe`, that it loads and
    embeds a text (deciding now if it was not yet)."""
    try:
        from tether.rag import _encoder_path as path
        from tether.rag._encoder import MiniLMEncoder, file_digest, find_model_file
    except ImportError:
        return Check("encoder", "missing", "the rag extra is not installed (pip install 'tether[rag]')")
    try:
        source = find_model_file()
        if not probe:
            known = None if os.environ.get("TETHER_EMBED_MODEL") else path.load(source, file_digest(source))
            return Check("encoder", "ok", known.line() if known else f"{source} (the graph for this CPU is chosen "
                                                                     "by measurement at first use)")
        import time

        started = time.monotonic()
        encoder = MiniLMEncoder()
        encoder.embed(["tether doctor"])
    except Exception as exc:
        return Check("encoder", "broken", f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}; unset "
                                          "TETHER_EMBED_MODEL or point it at an all-MiniLM-L6-v2 ONNX export")
    return Check("encoder", "ok", f"{path.describe(encoder.path)}; loaded and embedded a text in "
                                  f"{time.monotonic() - started:.1f} s")


def embedded_check(load: bool = True) -> Check:
    status = local_status()
    if not status.available:
        return Check("embedded model", "missing", status.detail)
    if not load:
        return Check("embedded model", "ok", status.detail)
    from tether.models._local import LocalModel  # loads llama.cpp: only when asked to check it works

    try:
        model = LocalModel(max_output_tokens=4)
        model.load()
    except Exception as exc:  # installed but broken: say so
        return Check("embedded model", "broken", f"{status.detail}: {type(exc).__name__}: {exc}")
    return Check("embedded model", "ok", f"loads: {model.path}")


def database_check(env: Mapping[str, str]) -> Check:
    configured = env.get("TETHER_DB")
    where = configured or str(default_database_path(env))
    try:
        from tether.store._sql import RunStore

        if not configured:  # the default's folder is made on first use (a path given never is)
            Path(where).parent.mkdir(parents=True, exist_ok=True)
        store = RunStore(where)
    except Exception as exc:
        state = "broken" if configured else "missing"
        return Check("run store", state, f"{_redact(where)}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    try:
        with store.engine.connect() as conn:
            # a real write, rolled back: a read-only file, a full disk or a store another process holds
            # locked shows here (a TEMP table would not touch the database file)
            trans = conn.begin()
            try:  # a statement that writes takes the write lock, whether or not a row matches
                if store.engine.dialect.name == "sqlite":
                    conn.exec_driver_sql("PRAGMA busy_timeout=2000")  # a held lock: said in 2 s, not the store's 30
                conn.exec_driver_sql("UPDATE tether_runs SET status = status WHERE 1 = 0")
            finally:
                trans.rollback()
            problem = _integrity(conn, store.engine.dialect.name)
    except Exception as exc:  # it opened, so it is there: what fails now is broken, configured or not
        orig = getattr(exc, "orig", None)
        shown = orig if isinstance(orig, BaseException) else exc
        problem = f"{type(shown).__name__}: {(str(shown).splitlines() or [''])[0]}"
    finally:
        store.close()
    if problem:
        return Check("run store", "broken", f"{_redact(where)}: {problem} (move it aside, or restore a copy)")
    return Check("run store", "ok", _redact(where))


def _integrity(conn: Any, dialect: str) -> str:
    """What is wrong with the database's pages ("" when nothing): SQLite's quick_check reads every
    page; any database, a read of every table tether writes (the commands' first queries)."""
    if dialect == "sqlite":
        found = [line for row in conn.exec_driver_sql("PRAGMA quick_check(3)") for line in str(row[0]).splitlines()
                 if not line.startswith("*** in database")]
        if found != ["ok"]:
            return ("corrupt: " + "; ".join(found))[:200]
    for table in ("tether_runs", "tether_events"):
        conn.exec_driver_sql(f"SELECT count(*) FROM {table}").all()
    return ""


def _redact(url: str) -> str:
    """A database URL without its password."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url


def run_checks(env: Mapping[str, str] | None = None, *, load_model: bool = True, probe: bool = False) -> list[Check]:
    env = os.environ if env is None else env
    return [sandbox_check(), *model_checks(env, probe), embedded_check(load_model), database_check(env),
            telemetry_check(env, probe), encoder_check(probe and load_model)]


def doctor(out: Callable[[str], None], env: Mapping[str, str] | None = None, *, load_model: bool = True,
           probe: bool = False) -> int:
    """Print the checks; 0 when nothing configured is broken, else 1. `probe`: send each configured model
    one real one-token request and the collector one span."""
    checks = run_checks(env, load_model=load_model, probe=probe)
    mark = {"ok": "ok     ", "missing": "missing", "broken": "BROKEN "}
    for c in checks:
        out(f"{mark[c.state]} {c.part:<16} {c.detail}")
    broken = [c.part for c in checks if c.state == "broken"]
    out(f"{len(broken)} broken: {', '.join(broken)}" if broken else "nothing configured is broken")
    return 1 if broken else 0
