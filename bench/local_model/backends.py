"""`python -m bench.local_model.backends`: llama-cpp-python against cyllama, side by side.

cyllama ships a manylinux wheel (no compiler, no build) where llama-cpp-python 0.3.36 is a source
distribution built on the user's machine. This measures, in one run, for both: install time
(cyllama into a fresh temporary venv; llama-cpp-python's build time is taken from a fresh build
in another temporary venv only with --build, since it takes minutes), model load time, and the
same grammar-constrained reply (tether's own tool grammar and chat, the embedded SmolLM2 GGUF,
temperature 0): its text and tokens per second. The temporary venvs are deleted afterwards.
Writes bench/local_model/backends.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CYLLAMA = "cyllama==0.2.18"  # the newest release with a CPython 3.11 wheel (0.7.0 has none)

_PROBE = r'''
import json, sys, time
job = json.loads(sys.argv[1])
t0 = time.perf_counter()
if job["backend"] == "cyllama":
    from cyllama.agents.constrained import GrammarConstrainedLLM as ConstrainedLLM
    from cyllama.api import GenerationConfig, apply_chat_template
    import_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    llm = ConstrainedLLM(job["gguf"], GenerationConfig(max_tokens=job["max_tokens"], temperature=0.0))
    prompt = apply_chat_template(job["chat"], job["gguf"])
    load_s = time.perf_counter() - t1
    runs = []
    for _ in range(job["repeats"]):
        t2 = time.perf_counter()
        text = llm.generate_with_grammar(prompt, job["grammar"])
        runs.append(time.perf_counter() - t2)
    n_out = len(llm.vocab.tokenize(text, add_special=False, parse_special=False))
    n_in = len(llm.vocab.tokenize(prompt, add_special=True, parse_special=True))
else:
    import llama_cpp
    import_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=job["gguf"], n_ctx=4096, n_threads=job["threads"],
                          n_threads_batch=job["threads"], verbose=False)
    load_s = time.perf_counter() - t1
    grammar = llama_cpp.LlamaGrammar.from_string(job["grammar"], verbose=False)
    runs = []
    for _ in range(job["repeats"]):
        llm.reset()  # no KV-cache reuse between repeats, as for cyllama
        t2 = time.perf_counter()
        out = llm.create_chat_completion(messages=job["chat"], grammar=grammar, max_tokens=job["max_tokens"],
                                         temperature=0.0, seed=0)
        runs.append(time.perf_counter() - t2)
    text = out["choices"][0]["message"]["content"]
    n_in, n_out = out["usage"]["prompt_tokens"], out["usage"]["completion_tokens"]
print(json.dumps({"import_s": import_s, "load_s": load_s, "reply_s": sorted(runs)[len(runs) // 2],
                  "text": text, "prompt_tokens": n_in, "completion_tokens": n_out}))
'''


def _job(threads: int, repeats: int) -> dict[str, Any]:
    from tether._types import Message, ModelRequest
    from tether.models._local import LocalModel, render_chat
    from tether.tools.builtin._calculator import calculator

    model = LocalModel(n_threads=threads)
    request = ModelRequest([Message.user("What is 17 * 23?")], [calculator.spec])
    return {"gguf": str(model.path), "chat": render_chat(request, brief=True), "max_tokens": 64,
            "grammar": model.grammar_text(request.tools, request.messages), "threads": threads,
            "repeats": repeats}


def _probe(python: str, job: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([python, "-c", _PROBE, json.dumps(job)], capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def _venv_install(tmp: Path, name: str, spec: str, env: dict[str, str] | None = None) -> tuple[str, float, str]:
    venv = tmp / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    start = time.perf_counter()
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--no-cache-dir", spec], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    return python, seconds, "" if proc.returncode == 0 else proc.stderr.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_model.backends", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--build", action="store_true", help="also time a fresh llama-cpp-python build (minutes)")
    parser.add_argument("--out", type=Path, default=HERE / "backends.json")
    args = parser.parse_args(argv)
    job = _job(args.threads, args.repeats)
    results: dict[str, Any] = {"threads": args.threads, "repeats": args.repeats,
                               "load_average_1m": round(os.getloadavg()[0], 2)}
    tmp = Path(tempfile.mkdtemp(prefix="tether-backends-"))
    try:
        python, seconds, error = _venv_install(tmp, "cyllama", CYLLAMA)
        cyl: dict[str, Any] = {"package": CYLLAMA, "install_s": round(seconds, 1), "install_error": error}
        if not error:
            cyl.update(_probe(python, {**job, "backend": "cyllama"}))
        results["cyllama"] = cyl
        llama: dict[str, Any] = {"package": "llama-cpp-python==0.3.36"}
        if args.build:
            _, seconds, error = _venv_install(tmp, "llama", "llama-cpp-python==0.3.36",
                                              {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"})
            llama.update({"install_s": round(seconds, 1), "install_error": error})
        llama.update(_probe(sys.executable, {**job, "backend": "llama_cpp_python"}))
        results["llama_cpp_python"] = llama
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'backend':<18} {'install s':>9} {'load s':>7} {'reply s':>8} {'tok/s':>6}  reply")
    for name in ("llama_cpp_python", "cyllama"):
        r = results[name]
        rate = r["completion_tokens"] / r["reply_s"] if r.get("reply_s") else 0
        print(f"{name:<18} {r.get('install_s', '-')!s:>9} {r.get('load_s', 0):>7.2f} {r.get('reply_s', 0):>8.2f} "
              f"{rate:>6.1f}  {r.get('text', r.get('error'))!r}")
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
