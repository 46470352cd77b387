"""The shipped int8 graphs on a CPU without VNNI, emulated: `python -m bench.rag_encoder.emulated`.

Runs tether's encoder check texts through each candidate graph (tether.rag._encoder_path) under
`qemu-x86_64 -cpu Haswell` (AVX2, no AVX-512, no VNNI: onnxruntime then takes its `vpmaddubsw`
path), and compares the vectors with the exact integer result shipped in rag/data/minilm-check.npz
and with the float graph's. Needs Debian's `qemu-user`; minutes, not seconds (emulated). Writes
`emulated_avx2` into bench/rag_encoder/results.json. Speed under emulation means nothing; only
the arithmetic does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

CHILD = """
import json, sys
import numpy as np
from tether.rag._encoder import MiniLMEncoder, CHECK_TEXTS, CHECK_VECTORS
from tether.rag._encoder_path import products_exact
z = np.load(CHECK_VECTORS)
out = {"products_exact": products_exact()}
for name, graph in json.loads(sys.argv[1]).items():
    v = MiniLMEncoder(graph, threads=1).embed(list(CHECK_TEXTS))
    out[name] = {"cosine_to_exact_int8": [round(float(x), 5) for x in (v * z["int8_" + name]).sum(1)],
                 "cosine_to_float": [round(float(x), 4) for x in (v * z["vectors"]).sum(1)]}
print(json.dumps(out))
"""


def main() -> int:
    from tether.rag import _encoder_path as path
    from tether.rag._encoder import find_model_file

    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        print("needs qemu-x86_64 (apt-get install qemu-user)", file=sys.stderr)
        return 1
    source = find_model_file()
    with tempfile.TemporaryDirectory() as tmp:
        graphs = {}
        for recipe in path.CANDIDATES:
            graphs[recipe.name] = str(Path(tmp) / f"{recipe.name}.onnx")
            recipe.rewrite(source, Path(graphs[recipe.name]))
        out = subprocess.run([qemu, "-cpu", "Haswell", sys.executable, "-c", CHILD, json.dumps(graphs)],
                             capture_output=True, text=True, check=False, env={"PYTHONPATH": str(REPO / "src"),
                                                                                "PATH": "/usr/bin:/bin"})
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
        return 1
    found = json.loads(out.stdout.strip().splitlines()[-1])
    exact = found.pop("products_exact")
    row = {"command": "python -m bench.rag_encoder.emulated", "cpu": "qemu-x86_64 -cpu Haswell (AVX2, no VNNI)",
           "products_exact": exact, "exact_bar": path.EXACT_COSINE, "graphs": found,
           "accepted": [r.name for r in path.CANDIDATES if (exact or path.cannot_saturate(r))
                        and min(found[r.name]["cosine_to_exact_int8"]) >= path.EXACT_COSINE
                        and min(found[r.name]["cosine_to_float"]) >= path.MIN_CHECK_COSINE]}
    results = HERE / "results.json"
    stored = json.loads(results.read_text()) if results.exists() else {}
    stored["emulated_avx2"] = row
    results.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
