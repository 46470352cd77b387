"""The encoder's accuracy test on this CPU with AVX-512, VNNI and AMX hidden (an AVX2-only CPU as
onnxruntime, numpy and tether see it): bench/rag_encoder/avx2_mask.c, an LD_PRELOAD shim that needs
CPUID faulting and gcc (skipped without them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository's bench/ package

from bench.rag_encoder.avx2_native import LAYERS, build, why_not  # noqa: E402

ACCURACY = "tests/test_rag_encoder.py::test_the_graph_the_decision_picks_for_accuracy_agrees_with_the_shipped_graph"


@pytest.fixture
def masked(tmp_path) -> dict[str, str]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), **build(tmp_path)}


def test_the_mask_makes_onnxruntime_numpy_and_tether_see_an_avx2_only_cpu(masked, tmp_path):
    seen = json.loads(subprocess.run([str(tmp_path / "cpuid_probe")], env=masked, capture_output=True, text=True,
                                     check=True).stdout)
    assert seen["avx2"] == 1 and not any(v for k, v in seen.items() if "512" in k or "vnni" in k or "amx" in k), seen
    out = subprocess.run([sys.executable, "-c", LAYERS], env=masked, capture_output=True, text=True, check=True)
    layers = json.loads(out.stdout.strip().splitlines()[-1])
    assert layers["numpy_avx2"] and not layers["numpy_avx512f"], layers
    assert layers["onnxruntime_products_exact"] is False, layers  # vpmaddubsw clips, as under qemu -cpu Haswell
    assert layers["tether_cpu"].endswith("; avx2"), layers


def test_the_accuracy_test_holds_on_an_avx2_only_cpu(masked):
    # the same test, run by pytest in a child that sees an AVX2-only CPU (its faulthandler chained by the shim):
    # the 7-bit graph is picked there, and short texts ("x": .9896 with it) go to the float graph
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", ACCURACY], cwd=REPO,
                         env=masked, capture_output=True, text=True, check=False, timeout=900)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]
