"""How long a process takes to exit after its run ends, with OTLP export on and the collector
answering, down (connection refused) or never answering; the median of 5 processes each. The probe
is what the CLI does: `instrument_from_env()`, one run, exit. Before the bounded exit: 13 s (down)
and 17 s (never answering), with 4 multi-line SDK errors.
Run: .venv/bin/python bench/console-otel/run.py (figures in results.json here)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROBE = """
import sys, time
import tether.telemetry
from tether import Agent
from tether.models._scripted import ScriptedModel
tether.telemetry.instrument_from_env()
Agent(ScriptedModel(["hi"])).run("Say hi.")
print(f"END {time.time():.4f}", file=sys.stderr)
"""
release = threading.Event()


class Accepting(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Silent(Accepting):
    def do_POST(self) -> None:
        release.wait(120)


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def once(port: int) -> tuple[float, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "OTEL_"))}
    env.update(PYTHONPATH=str(REPO / "src"), OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}")
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    exited = time.time()
    lines = done.stderr.splitlines()
    end = float(next(line for line in lines if line.startswith("END ")).split()[1])
    return exited - end, [line for line in lines if not line.startswith("END ")]


def main() -> None:
    ok, silent = serve(Accepting), serve(Silent)
    out: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "processes": 5,
                              "what": "seconds from the run's end to the process's exit"}
    for name, port in (("collector_ok", ok.server_port), ("collector_down", closed_port()),
                       ("collector_silent", silent.server_port)):
        results = [once(port) for _ in range(5)]
        out[f"{name}_exit_s"] = round(statistics.median(t for t, _ in results), 2)
        out[f"{name}_exit_max_s"] = round(max(t for t, _ in results), 2)
        out[f"{name}_stderr"] = sorted({line for _, lines in results for line in lines})
    release.set()
    for server in (ok, silent):
        server.shutdown()
    (HERE / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
