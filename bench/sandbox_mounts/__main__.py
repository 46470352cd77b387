"""What the allowlisted mounts cost per Bash call: `bash -c true` through `Bubblewrap.launch` (the
toolchain, /etc's allowlist and the workspace, ~50 mount operations) against the mounts it replaced
(`--ro-bind / /` with a few paths hidden), interleaved, on a workspace a normal user owns.

    python -m bench.sandbox_mounts            # writes bench/sandbox_mounts/results.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tether.tools._sandbox import SANDBOX_HOME, Bubblewrap, probe_bubblewrap

RUNS = 40


def _old_argv(box: Bubblewrap, launch: list[str]) -> list[str]:
    """The same launch with the mounts before the allowlist: the host's root read-only, a few paths hidden."""
    ws = str(box.workspace.resolve())
    head = launch[1:launch.index("--ro-bind")]  # the namespace options
    tail = launch[launch.index("--chdir"):]
    mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp",
              "--perms", "0777", "--dir", SANDBOX_HOME]
    mounts += ["--tmpfs", "/root", "--tmpfs", "/run", "--tmpfs", "/var/tmp"]
    for parent in sorted(Path(ws).parents, key=lambda p: len(p.parts)):
        if str(parent).startswith("/tmp/"):
            mounts += ["--perms", "0755", "--dir", str(parent)]
    return [launch[0], *head, *mounts, "--bind", ws, ws, *tail]


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
    return time.perf_counter() - t0


def _summary(seconds: list[float]) -> dict[str, float]:
    xs = sorted(seconds)
    return {"median_ms": round(statistics.median(xs) * 1000, 2),
            "p90_ms": round(xs[int(len(xs) * 0.9)] * 1000, 2)}


def _mounts(argv: list[str]) -> int:
    return sum(a in ("--ro-bind", "--bind", "--symlink", "--dir", "--tmpfs", "--dev", "--proc") for a in argv)


def main() -> int:
    problem = probe_bubblewrap()
    if problem is not None:
        print(f"bubblewrap cannot run here: {problem}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        if os.geteuid() == 0:
            os.chown(ws, 65534, 65534)  # a normal user's workspace: no id-mapped view in either case
        box = Bubblewrap(ws)
        launch = box.launch(["bash", "-c", "true"], cwd=ws, env={"PATH": "/usr/bin:/bin"})
        old = _old_argv(box, launch.argv)
        new_times: list[float] = []
        old_times: list[float] = []
        for _ in range(RUNS):
            new_times.append(_time(launch.argv, launch.env))
            old_times.append(_time(old, launch.env))
    result = {
        "command": "python -m bench.sandbox_mounts",
        "runs_each": RUNS,
        "allowlist": _summary(new_times),
        "host_root_before": _summary(old_times),
        "mount_operations": {"allowlist": _mounts(launch.argv), "host_root_before": _mounts(old)},
        "load_average_1m": round(os.getloadavg()[0], 2),
        "as_root": os.geteuid() == 0,
    }
    out = Path(__file__).with_name("results.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
