"""The first ingest on this CPU with its AVX-512, VNNI and AMX hidden: `python -m bench.rag_encoder.avx2_native`.

Compiles avx2_mask.c (an LD_PRELOAD shim: CPUID faulting makes every CPUID trap, the shim answers
with those features cleared and serves /proc/cpuinfo without their flags) and cpuid_probe.c, shows
what each layer sees with and without it (CPUID bits, numpy's dispatch, onnxruntime's uint8 x int8
product: exact with VNNI, clipped on AVX2's `vpmaddubsw`; tether's CPU summary), then runs the first
ingest of bench.rag_encoder.ingest (empty TETHER_HOME and TETHER_CACHE: the encoder decision is
part of it) unmasked and masked, natively. glibc's own AVX-512 string functions are switched off
for the masked run with GLIBC_TUNABLES. Same microarchitecture with features hidden, not an older
CPU: caches, clocks and the speed of each instruction stay this CPU's. Needs gcc and `cpuid_fault`
(skips with a message otherwise). Writes `avx2_native` into bench/rag_encoder/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.rag_encoder.ingest import first_ingest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GLIBC_HIDE = "glibc.cpu.hwcaps=-AVX512F,-AVX512BW,-AVX512CD,-AVX512DQ,-AVX512VL,-AVX512ER,-AVX512PF"

LAYERS = """
import json
from numpy._core._multiarray_umath import __cpu_features__ as f
from tether.rag._encoder_path import cpu_summary, products_exact
print(json.dumps({"numpy_avx512f": f["AVX512F"], "numpy_avx512_skx": f["AVX512_SKX"], "numpy_avx2": f["AVX2"],
                  "onnxruntime_products_exact": products_exact(), "tether_cpu": cpu_summary()[0]}))
"""

# tests/test_rag_encoder.py's accuracy test, measured: the decision's graph against the shipped one on
# its short texts and 60 abstracts (it asks min > .99 and mean > .997)
ACCURACY = """
import json, os, sys, tempfile
import numpy as np
os.environ["TETHER_CACHE"] = tempfile.mkdtemp()
from tether.rag._encoder import MiniLMEncoder, find_model_file
texts = json.loads(sys.argv[1])
fast = MiniLMEncoder(threads=1)
cos = (fast.embed(texts) * MiniLMEncoder(find_model_file(), threads=1).embed(texts)).sum(axis=1)
low = int(cos.argmin())
print(json.dumps({"recipe": fast.path.recipe, "min": round(float(cos.min()), 4), "mean": round(float(cos.mean()), 4),
                  "lowest_text": texts[low][:60]}))
"""
TEST_TEXTS = ["Refunds are issued within 30 days of the return.", "Can I get my money back?",
              "Parcels ship to Norway and Sweden within a week.",
              "The eighteenth edition of the Dewey Decimal Classification was published in 1971 " * 12, "x"]


def why_not() -> str | None:
    """Why the shim cannot run here, or None."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "needs Linux on x86-64"
    if shutil.which("gcc") is None:
        return "needs gcc to compile the shim (apt-get install gcc)"
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    if "cpuid_fault" not in flags.split():
        return "this CPU (or hypervisor) has no CPUID faulting (`cpuid_fault` in /proc/cpuinfo)"
    return None


def build(folder: Path) -> dict[str, str]:
    """Compile the shim and the probe into `folder`: the environment that masks a child."""
    shim, probe = folder / "avx2_mask.so", folder / "cpuid_probe"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(HERE / "avx2_mask.c"), "-ldl"], check=True)
    subprocess.run(["gcc", "-O2", "-o", str(probe), str(HERE / "cpuid_probe.c")], check=True)
    return {"LD_PRELOAD": str(shim), "GLIBC_TUNABLES": GLIBC_HIDE}


def layers(folder: Path, masked: dict[str, str] | None) -> dict[str, Any]:
    """What the CPUID instruction, numpy, onnxruntime and tether see in a child (masked or not)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(masked or {})}
    probe = subprocess.run([str(folder / "cpuid_probe")], env=env, capture_output=True, text=True, check=True)
    py = subprocess.run([sys.executable, "-c", LAYERS], env=env, capture_output=True, text=True, check=True)
    return {"cpuid": json.loads(probe.stdout), **json.loads(py.stdout.strip().splitlines()[-1])}


def accuracy(texts: list[str], masked: dict[str, str] | None) -> dict[str, Any]:
    """The accuracy test's figures in a child (masked or not), with the decision made afresh."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(masked or {})}
    for k in ("TETHER_EMBED_MODEL", "TETHER_EMBED_INT8"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", ACCURACY, json.dumps(texts)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", default="cisi")
    ap.add_argument("--documents", type=int, default=1400)
    args = ap.parse_args(argv)
    reason = why_not()
    if reason:
        print(f"skipped: {reason}", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        masked = build(Path(tmp))
        seen = {"unmasked": layers(Path(tmp), None), "avx2_only": layers(Path(tmp), masked)}
        if seen["avx2_only"]["cpuid"]["avx512f"] or seen["avx2_only"]["onnxruntime_products_exact"]:
            raise SystemExit(f"the mask did not hold: {json.dumps(seen['avx2_only'])}")
        from bench.retrieval.__main__ import data_dir

        abstracts = [json.loads(line)["text"] for line in
                     (data_dir() / "cisi" / "corpus.jsonl").read_text().splitlines()[:60]]
        texts = TEST_TEXTS + abstracts
        checked = {"unmasked": accuracy(texts, None), "avx2_only": accuracy(texts, masked)}
        runs = {"unmasked": first_ingest(args.collection, args.documents),
                "avx2_only": first_ingest(args.collection, args.documents, masked)}
    row = {"command": f"python -m bench.rag_encoder.avx2_native --collection {args.collection} "
                      f"--documents {args.documents}",
           "method": "this CPU with AVX-512, VNNI and AMX hidden from CPUID (CPUID faulting + LD_PRELOAD "
                     "bench/rag_encoder/avx2_mask.c), /proc/cpuinfo flags filtered alike, glibc's AVX-512 "
                     f"functions off ({GLIBC_HIDE}); same microarchitecture, not an older CPU",
           "seen": seen,
           "accuracy_test": {"bar": "min > 0.99, mean > 0.997 (tests/test_rag_encoder.py)", **checked},
           "ingest": runs}
    path = HERE / "results.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored["avx2_native"] = row
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
