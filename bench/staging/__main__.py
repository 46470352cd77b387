"""Staged runs: what the staging layer costs, side by side with working on the workspace directly.

    python -m bench.staging        # prints a table, writes bench/staging/results.json

- `stage_create_ms`: copying a workspace of N files (1,000 x 2 KB in 20 directories, plus a `.git`
  that is not copied) into a stage, with its manifest (sha256 of every file).
- per file write: the `Write` tool called through `Tool.run` N times on the workspace directly and on
  the staged view; `write_us_direct`, `write_us_staged`, and their ratio.
- per Bash call: `true` in bubblewrap on the workspace and on the staged view (the view mounted at the
  workspace's path, the real `.git` read-only on it); their ratio (skipped without bubblewrap).
- `changes_ms` (diff of 1,000 changed files against the manifest), `apply_ms` (1,000 files written
  into the workspace with a journal), `undo_ms` (all 1,000 put back).
Medians of repetitions; wall time (the machine is shared: read the ratios).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tether.staging import StagedWorkspace
from tether.tools._sandbox import probe_bubblewrap
from tether.tools.builtin import shell_tool, write_tool

FILES = 1_000
WRITES = 200
BASH_CALLS = 15
HERE = Path(__file__).resolve().parent


def make_workspace(root: Path, name: str = "ws") -> Path:
    ws = root / name
    for i in range(FILES):
        d = ws / f"pkg{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(f"# module {i}\n" + "x = 1\n" * 340)
    (ws / ".git" / "objects").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return ws


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def time_writes(tool_root: Path, stage: StagedWorkspace | None) -> float:
    write = write_tool(tool_root, stage=stage)
    started = time.perf_counter()
    for i in range(WRITES):
        write(file_path=f"out/w{i}.txt", content=f"line {i}\n" * 20)
    return (time.perf_counter() - started) / WRITES


def time_bash(ws: Path, stage: StagedWorkspace | None) -> float:
    bash = shell_tool(ws, stage=stage)

    async def calls() -> float:
        started = time.perf_counter()
        for _ in range(BASH_CALLS):
            await bash(command="true")
        return (time.perf_counter() - started) / BASH_CALLS

    return asyncio.run(calls())


def main() -> int:
    rounds = 3
    out: dict[str, object] = {"files": FILES, "writes": WRITES, "bash_calls": BASH_CALLS, "rounds": rounds}
    create, changes, apply, undo, w_direct, w_staged, b_direct, b_staged = ([] for _ in range(8))
    bwrap = probe_bubblewrap() is None
    for _ in range(rounds):
        tmp = Path(tempfile.mkdtemp(prefix="tether-bench-staging-"))
        try:
            ws = make_workspace(tmp)
            t = time.perf_counter()
            stage = StagedWorkspace.create(ws, root=tmp / "stages")
            create.append(time.perf_counter() - t)
            twin = make_workspace(tmp, "direct")  # the same workspace, written directly
            w_direct.append(time_writes(twin, None))
            w_staged.append(time_writes(ws, stage))
            if bwrap:
                b_direct.append(time_bash(twin, None))
                b_staged.append(time_bash(ws, stage))
            for p in sorted(stage.view.glob("pkg*/mod*.py")):
                p.write_text(p.read_text() + "y = 2\n")
            t = time.perf_counter()
            found = stage.changes()
            changes.append(time.perf_counter() - t)
            t = time.perf_counter()
            report = stage.apply()
            apply.append(time.perf_counter() - t)
            assert len(report.done) == len(found) == FILES + WRITES, (len(report.done), len(found))
            t = time.perf_counter()
            undone = stage.undo()
            undo.append(time.perf_counter() - t)
            assert len(undone.done) == len(report.done) and not undone.skipped
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    out.update(stage_create_ms=ms(med(create)), changes_ms=ms(med(changes)), apply_ms=ms(med(apply)),
               undo_ms=ms(med(undo)), write_us_direct=round(med(w_direct) * 1e6, 1),
               write_us_staged=round(med(w_staged) * 1e6, 1),
               write_ratio=round(med(w_staged) / med(w_direct), 2))
    if bwrap:
        out.update(bash_ms_direct=ms(med(b_direct)), bash_ms_staged=ms(med(b_staged)),
                   bash_ratio=round(med(b_staged) / med(b_direct), 2))
    else:
        out["bash"] = f"skipped: {probe_bubblewrap()}"
    out["measured"] = time.strftime("%Y-%m-%d")
    for key, value in out.items():
        print(f"{key:>18}  {value}")
    (HERE / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
