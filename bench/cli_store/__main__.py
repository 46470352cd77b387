"""`python -m bench.cli_store`: what recording a CLI run in the run store costs (tether -p stores
every run once it ended, after the answer is printed).

Measured: (1) opening the store in a fresh process that has loaded what `tether -p` has by then
(importing SQLAlchemy and the store, connecting, checking the schema), on a new file and on an
existing one; (2) writing one finished run (its row, state and
events in one transaction) for runs of 1, 10 and 40 steps with a calculator call each, as
`RunStore.record_run` does at the end of `tether -p`; (3) `tether -p` end to end against a local
fake model server (tests/fake_openai_server.py), stored and with --no-store, alternated. The run's
own steps never touch the store; it is opened on a thread while the run works.
Writes bench/cli_store/results.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether._types import RunResult

HERE = Path(__file__).resolve().parent
# what a `tether -p` process has loaded by the time its run ended is not counted
OPEN = """
import sys, time
import tether._types, tether.events, tether.tools._results, tether.cli._app
t = time.perf_counter()
from tether.store import RunStore
s = RunStore(sys.argv[1])
s.close()
print(time.perf_counter() - t)
"""


def _open_seconds(path: Path) -> float:
    out = subprocess.run([sys.executable, "-c", OPEN, str(path)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _result(steps: int) -> RunResult:
    from tether import Agent, Limits
    from tether.models._scripted import ScriptedModel, call
    from tether.tools.builtin import calculator

    script = [call("calculator", expression=f"{i} * 7") for i in range(steps - 1)] + ["done"]
    agent = Agent(ScriptedModel(script), tools=[calculator], limits=Limits(max_steps=steps + 1))
    return agent.run("multiply a few numbers")


def _end_to_end(folder: Path, rounds: int = 7) -> dict[str, float]:
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENROUTER_", "TETHER_"))}
    env["TETHER_DB"] = str(folder / "e2e.db")
    walls: dict[str, list[float]] = {"stored": [], "no_store": []}

    def reply(request: Any) -> dict[str, Any]:  # the fake server's responder
        if request.body["messages"][-1]["role"] == "tool":
            return chat_completion("391")
        return chat_completion(None, [tool_call("calculator", {"expression": "17 * 23"})])

    with FakeOpenAIServer(responder=reply) as server:
        env.update(OPENROUTER_API_KEY="sk-bench", OPENROUTER_BASE_URL=server.base_url)
        for i in range(rounds * 2):
            mode = "stored" if i % 2 == 0 else "no_store"
            args = [sys.executable, "-m", "tether.cli", "-p", "What is 17 * 23?", "--tools", "calculator"]
            t = time.perf_counter()
            done = subprocess.run(args + (["--no-store"] if mode == "no_store" else []), env=env,
                                  capture_output=True, text=True, timeout=120, cwd=folder)
            walls[mode].append(time.perf_counter() - t)
            assert done.stdout == "391\n", done.stderr
    return {f"{mode}_s_median": round(statistics.median(v), 3) for mode, v in walls.items()}


def main() -> int:
    from tether.store import RunStore

    folder = Path(tempfile.mkdtemp(prefix="bench-cli-store-"))
    new = [_open_seconds(folder / f"new{i}.db") for i in range(5)]
    existing = [_open_seconds(folder / "new0.db") for _ in range(5)]
    writes: dict[str, dict[str, float | int]] = {}
    store = RunStore(folder / "runs.db")
    for steps in (1, 10, 40):
        result = _result(steps)
        times = []
        for _ in range(10):
            copy = dataclasses.replace(result, run_id=uuid.uuid4().hex[:12])
            t = time.perf_counter()
            store.record_run(copy, agent="cli", user="bench", prompt="multiply a few numbers")
            times.append(time.perf_counter() - t)
        stored = [e for e in result.trace if e.kind != "text_delta"]
        writes[f"{steps}_steps"] = {"events": len(stored), "ms_median": round(statistics.median(times) * 1000, 2),
                                    "ms_max": round(max(times) * 1000, 2)}
    store.close()
    end_to_end = _end_to_end(folder)
    out = {
        "command": "python -m bench.cli_store",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2)},
        "open_ms_new_file_median": round(statistics.median(new) * 1000, 1),
        "open_ms_existing_file_median": round(statistics.median(existing) * 1000, 1),
        "record_run": writes,
        "tether_p_end_to_end": end_to_end,
    }
    (HERE / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
