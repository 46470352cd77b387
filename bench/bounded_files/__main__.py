"""The file tools on hostile input, measured: seconds and memory growth per call, each call in a fresh
child process (memory is the child's ru_maxrss after the call less before it).

    python -m bench.bounded_files       # prints the figures, writes bench/bounded_files/results.json

- grep_catastrophic: Grep('^(a+)+$') over a 41-character line; beside it Python's `re` on shorter
  lines (it doubles per added character, so 41 would take about 2**17 times the 24-character figure);
- read_sparse: Read of a 1.5 GB sparse file (9,000 bytes of text, then zeros, no newline) with
  offset=1 limit=2 and offset=2 limit=2 (the second scans to Read's 256 MiB ceiling);
- read_long_line: Read(offset=1, limit=2) of a 64 MiB one-line text file;
- grep_5mb: Grep of a literal over a 5 MB, 100,000-line file (RE2, per line), beside Python's `re` doing
  the same per line (what the switch costs on ordinary input).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

CHILD = """
import json, resource, sys, time
from tether.tools.builtin._files import grep_tool, read_tool
kind, root, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tool = (grep_tool if kind == "grep" else read_tool)(root)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
try:
    out = tool.fn(**args)
except ValueError as exc:
    out = "error: " + str(exc)
seconds = time.perf_counter() - t0
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"seconds": round(seconds, 4), "memory_growth_mb": round(grew / 1024, 1), "said": out[-160:]}))
"""

PY_RE = """
import re, sys, time
n = int(sys.argv[1])
rx = re.compile("^(a+)+$")
t0 = time.perf_counter()
rx.search("a" * n + "!")
print(round(time.perf_counter() - t0, 3))
"""

PER_LINE = """
import re, sys, time
data = open(sys.argv[1], "rb").read()
rx = re.compile(rb"def \\w+_tool")
t0 = time.perf_counter()
hits = sum(1 for line in data.split(b"\\n") if rx.search(line))
print(round(time.perf_counter() - t0, 4))
"""


def call(kind: str, root: Path, **args: Any) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(root), json.dumps(args)], capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(proc.stdout)


def py(code: str, *argv: str) -> float:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], capture_output=True, text=True,
                          timeout=300, check=True)
    return float(proc.stdout)


def main() -> int:
    results: dict[str, Any] = {"load_average_at_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="tether-bounded-") as tmp:
        ws = Path(tmp)
        (ws / "evil.txt").write_text("a" * 40 + "!\n")
        results["grep_catastrophic"] = {
            "tether_grep": call("grep", ws, pattern="^(a+)+$", path="evil.txt"),
            "python_re_seconds_by_line_length": {str(n): py(PY_RE, str(n)) for n in (20, 22, 24)},
        }
        (ws / "evil.txt").unlink()
        big = ws / "big.log"
        big.write_bytes(b"x" * 9_000)
        os.truncate(big, 1_500_000_000)
        results["read_sparse"] = {
            "offset_1_limit_2": call("read", ws, file_path="big.log", offset=1, limit=2),
            "offset_2_limit_2": call("read", ws, file_path="big.log", offset=2, limit=2),
        }
        big.unlink()
        (ws / "min.js").write_bytes(b"a" * (64 << 20) + b"\nsecond\n")
        results["read_long_line"] = call("read", ws, file_path="min.js", offset=1, limit=2)
        (ws / "min.js").unlink()
        src = ws / "src.py"
        src.write_bytes(b"".join(b"    x = some_function(arg, other) # comment %d\n" % i for i in range(100_000)))
        results["grep_5mb"] = {
            "tether_grep": call("grep", ws, pattern=r"def \w+_tool", path="src.py"),
            "python_re_per_line_seconds": py(PER_LINE, str(src)),
        }
    text = json.dumps(results, indent=2)
    (HERE / "results.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
