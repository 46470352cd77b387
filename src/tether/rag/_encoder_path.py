"""Which graph the MiniLM encoder runs on this CPU, decided once by measurement and remembered.

Integer matrix products are exact only where the CPU multiplies uint8 by int8 into 32 bits (VNNI,
AMX). CPUs without VNNI (AVX2, AVX-512 before Cascade Lake) run onnxruntime's uint8 x int8
product on `vpmaddubsw`, which adds each pair of products in 16 bits and saturates: large
activations times large weights come out clipped, and vectors drift (cosine .966 to the float
graph on one text). With inputs of 7 bits (0..127) no pair can reach the limit (2 x 127 x 128 <
32768): exact again at the same speed, one bit of input precision less (each token's input is
quantised over its own range: tether.rag._int8).

So on first use each int8 candidate (`CANDIDATES`: 8-bit inputs, then 7-bit) is derived, embeds
`CHECK_TEXTS`, and is accepted only if its vectors match the exact integer result shipped with
tether (cosine >= EXACT_COSINE) and the float graph's (>= MIN_CHECK_COSINE); every candidate and
the float graph are timed on the same texts. The first accepted candidate in that order (the more
precise) is used unless a later one is more than PRECISION_MARGIN faster (25%: both run the same integer
kernels, so a smaller gap is timing noise on a busy machine), and only if it beats the float graph;
otherwise the float graph runs, and the reason says so.
The decision is kept under $TETHER_CACHE/models, per CPU (model and flags), onnxruntime version
and shipped graph, and is what `tether doctor` and the first line of `tether ingest` show.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tether.rag import _int8 as int8

# Measured in bench/rag_encoder: one input scale per call (onnxruntime's DynamicQuantizeMatMul)
# left vectors at cosine .987 to the float graph's and `best` .003 nDCG@10 below float on CISI.
# Each token's input quantised over its own range keeps them within .998 (8-bit inputs) and .995
# (7-bit); the attention output and feed-forward in, whose inputs are centred, use a symmetric
# range (no correction term: cheaper, as precise). 7-bit inputs (0..127) times int8 weights cannot
# saturate the 16-bit pair sums of CPUs without VNNI: exact there, the weights keep their 8 bits.
# The names are in the derived files' and the index's vector keys: a new name when the vectors change
# (r8 -> r8b, r7 -> r7b: the GELU reordered so that onnxruntime fuses it, `int8.rewrite`; r7b also
# symmetric where r8 is, 7-bit: 1..127 around 64, still 2 x 127 x 128 < 32768).
CENTRED = int8.products("attention output", "feed-forward in")
ROW8 = int8.Recipe("r8b", per_row=True, symmetric=CENTRED)
ROW7 = int8.Recipe("r7b", per_row=True, seven_bit_inputs=True, symmetric=CENTRED)
CANDIDATES = (ROW8, ROW7)
LABELS = {ROW8.name: "int8 (8-bit inputs per token)", ROW7.name: "int8 (7-bit inputs per token, for CPUs without VNNI)",
          "float": "float (the shipped graph)"}
# To the int8 vectors computed exactly on one CPU: another's float kernels (softmax, GELU, layer
# norm) differ in the last bits, which moves some values across a rounding step (.9978 on one
# check text under an emulated Haswell, whose integer products are exact). Exactness itself is
# probed directly (`products_exact`).
EXACT_COSINE = 0.995
MIN_CHECK_COSINE = 0.99  # to the float graph's vectors (the recipes measure .995+ on abstracts)
# Texts of at most this many tokens ([CLS] and [SEP] included) are embedded by the float graph on
# every CPU (tether.rag._encoder): the 7-bit graph put 18 of 43 texts of 1-3 tokens below .99 of the
# float graph's vectors ("x" .9896, "yes" .980), 8 of 34 of 4 tokens, 2 of 35 of 5; none from 6 up
# (worst .9912 over 402 texts of 6-300 tokens; bench/rag_encoder/short_texts.py). 8 leaves a margin,
# and no window of an ordinary document is that short (the shortest of 1,400 CISI abstracts: 14).
SHORT_TOKENS = 8
MIN_SPEEDUP = 1.1  # an int8 graph must beat the float one by this much to be worth it
PRECISION_MARGIN = 1.25  # a less precise graph must be this much faster than a more precise one to be taken
TIMING_TEXTS = 16  # CHECK_TEXTS repeated: one batch per call, as an ingest embeds them


# A derived graph is used only if its vectors of these texts agree with the exact int8 result
# and the shipped graph's (tether.rag._encoder_path).
CHECK_TEXTS = (
    "The present study is a history of the Dewey Decimal Classification.",
    "Patients with chronic renal failure were given a low-protein diet for six months.",
    "An algorithm for sorting a list of records by several keys in one pass over a tape.",
    "what is the capital of france",
    "pip install 'tether[rag]' && tether ingest docs/ && tether search \"approval budget\"",
)


def cannot_saturate(recipe: int8.Recipe) -> bool:
    """No pair of its uint8 x int8 products can exceed 16 bits: exact on every x86 CPU."""
    return recipe.seven_bits or recipe.seven_bit_inputs or recipe.unsigned


def cache_root() -> Path:
    """Where derived files live: $TETHER_CACHE, else ~/.cache/tether."""
    env = os.environ.get("TETHER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tether"


@dataclass
class EncoderPath:
    """The graph chosen for this CPU and why: what `tether doctor` and `tether ingest` show."""

    graph: str  # the ONNX file to run
    recipe: str  # a Recipe name, or "float"
    reason: str
    cpu: str
    measured: dict[str, dict[str, float]] = field(default_factory=dict)  # per candidate: cosines, ms per text
    decided: str = ""  # when (UTC, ISO 8601)

    @property
    def label(self) -> str:
        return LABELS.get(self.recipe, self.recipe)

    def line(self) -> str:
        short = "" if self.recipe == "float" else f"; texts of at most {SHORT_TOKENS} tokens: the float graph"
        return f"encoder: {self.label} on this CPU ({self.cpu}): {self.reason}{short}"


def cpu_summary() -> tuple[str, str]:
    """(a short description of this CPU's model and the flags that matter, a key for all its flags)."""
    model, flags = "", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = value.strip()
    import platform

    have = set(flags.split())
    shown = [f for f in ("avx2", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm") if f in have]
    summary = f"{model or platform.processor() or platform.machine()}; {' '.join(shown) or 'no int8 dot-product flags'}"
    return summary, hashlib.sha256(f"{platform.machine()}|{model}|{' '.join(sorted(have))}".encode()).hexdigest()[:12]


def decision_file(source: Path, digest: str) -> Path:
    import onnxruntime as ort

    _, cpu_key = cpu_summary()
    recipes = "-".join(r.name for r in CANDIDATES)
    return cache_root() / "models" / f"path-{cpu_key}-{recipes}-{digest}-ort{ort.__version__}.json"


def derived_file(recipe: int8.Recipe, digest: str) -> Path:
    import onnxruntime as ort

    return cache_root() / "models" / f"minilm-{recipe.name}-{digest}-ort{ort.__version__}.onnx"


def load(source: Path, digest: str) -> EncoderPath | None:
    """The decision made earlier on this machine, if its graph is still there."""
    try:
        data = json.loads(decision_file(source, digest).read_text())
        path = EncoderPath(**data)
    except (OSError, ValueError, TypeError):
        return None
    return path if Path(path.graph).is_file() else None


def decide(source: Path, digest: str, reference: dict[str, np.ndarray], encoder: Callable[..., Any]) -> EncoderPath:
    """Measure every candidate and the float graph here, choose, and remember the choice.

    `reference`: the float graph's vectors of CHECK_TEXTS under "float", and the exact int8
    vectors of each recipe under its name (when tether ships them for this graph); `encoder`: makes the
    encoder that runs a graph (`encoder(graph, threads=1)`, tether.rag._encoder.MiniLMEncoder)."""
    summary, _ = cpu_summary()
    measured: dict[str, dict[str, float]] = {}
    texts = [CHECK_TEXTS[i % len(CHECK_TEXTS)] for i in range(TIMING_TEXTS)]
    float_vectors, measured["float"] = _measure(encoder, source, texts)
    float_ref = reference.get("float")
    if float_ref is None:
        float_ref = float_vectors[: len(CHECK_TEXTS)]
    accepted: list[tuple[float, int8.Recipe, Path]] = []
    failures: list[str] = []
    target_dir = derived_file(ROW8, digest).parent
    for recipe in CANDIDATES:
        target = derived_file(recipe, digest)
        try:
            target_dir.mkdir(parents=True, exist_ok=True)
            if not target.is_file():
                with tempfile.TemporaryDirectory(dir=target_dir, prefix=".derive-") as tmp:
                    made = Path(tmp) / "int8.onnx"
                    if not recipe.rewrite(source, made):
                        failures.append(f"{LABELS[recipe.name]}: the graph is not the packaged one")
                        continue
                    os.replace(made, target)  # atomic: a racing process finds a whole file or none
        except (ImportError, OSError) as exc:  # no `onnx` package; a read-only cache
            failures.append(f"{LABELS[recipe.name]} could not be made ({exc})")
            continue
        if not cannot_saturate(recipe) and not products_exact():
            measured[recipe.name] = {"products_exact": 0.0}
            failures.append(f"{LABELS[recipe.name]} is not exact here (a uint8 x int8 product probed came out "
                            "clipped: 16-bit sums saturate without VNNI)")
            continue
        vectors, m = _measure(encoder, target, texts)
        got = vectors[: len(CHECK_TEXTS)]
        m["cosine_to_float"] = round(float((got * float_ref).sum(axis=1).min()), 4)
        exact = reference.get(recipe.name)
        if exact is not None:
            m["cosine_to_exact_int8"] = round(float((got * exact).sum(axis=1).min()), 5)
        measured[recipe.name] = m
        if exact is not None and m["cosine_to_exact_int8"] < EXACT_COSINE:
            failures.append(f"{LABELS[recipe.name]} is not right here (cosine {m['cosine_to_exact_int8']:.4f} to its "
                            f"integer result < {EXACT_COSINE})")
        elif m["cosine_to_float"] < MIN_CHECK_COSINE:
            failures.append(f"{LABELS[recipe.name]} disagrees with the float graph (cosine "
                            f"{m['cosine_to_float']:.3f} < {MIN_CHECK_COSINE})")
        else:
            accepted.append((m["ms_per_text"], recipe, target))
    float_ms = measured["float"]["ms_per_text"]
    why_not = "; ".join(failures)
    if accepted:
        fastest = min(a[0] for a in accepted)
        ms, recipe, target = next(a for a in accepted if a[0] <= fastest * PRECISION_MARGIN)
        speedup = float_ms / ms
        if speedup >= MIN_SPEEDUP:
            reason = (f"{speedup:.1f}x the float graph's speed ({ms:.1f} vs {float_ms:.1f} ms a text), vectors within "
                      f"{measured[recipe.name]['cosine_to_float']:.3f} of it" + (f"; {why_not}" if why_not else ""))
            return _save(source, digest, EncoderPath(str(target), recipe.name, reason, summary, measured))
        why_not = (f"{why_not}; " if why_not else "") + \
            f"{LABELS[recipe.name]} is only {speedup:.2f}x the float graph's speed here"
    reason = f"SLOW PATH, no int8 graph is usable here: {why_not or 'none could be made'}"
    return _save(source, digest, EncoderPath(str(source), "float", reason, summary, measured))


def products_exact() -> bool:
    """Whether onnxruntime multiplies uint8 by int8 exactly on this CPU: a product whose pairs of
    terms overflow 16 bits (255 x -128 twice), as `vpmaddubsw` (AVX2 without VNNI) clips them."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    a = np.concatenate([np.full((2, 64), 255), rng.integers(0, 256, (6, 64))]).astype(np.uint8)
    w = np.concatenate([np.full((64, 2), -128), np.full((64, 2), 127), rng.integers(-128, 128, (64, 4))], axis=1)
    w = w.astype(np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = np.asarray(session.run(None, {"a": a})[0])
    return bool(np.array_equal(got, a.astype(np.int64) @ w.astype(np.int64)))


def _measure(encoder: Callable[..., Any], graph: Path, texts: list[str]) -> tuple[np.ndarray, dict[str, float]]:
    """The graph's vectors of `texts` and its CPU milliseconds a text (best of three, one thread)."""
    enc = encoder(graph, threads=1)
    vectors = enc.embed(texts)
    best = float("inf")
    for _ in range(3):
        t = time.thread_time()
        enc.embed(texts)
        best = min(best, time.thread_time() - t)
    del enc
    return vectors, {"ms_per_text": round(1000 * best / len(texts), 2)}


def _save(source: Path, digest: str, path: EncoderPath) -> EncoderPath:
    path.decided = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    target = decision_file(source, digest)
    with contextlib.suppress(OSError):  # unwritable: decided again next time, still not silently
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".path-")
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(path), f, indent=1)
        os.replace(tmp, target)
    return path


def describe(path: Any) -> str:
    """One line for an encoder's `path`: None for a graph given by TETHER_EMBED_MODEL (or by path)."""
    if isinstance(path, EncoderPath):
        return path.line()
    given = os.environ.get("TETHER_EMBED_MODEL")
    return f"encoder: {given} (TETHER_EMBED_MODEL), run as is" if given else "encoder: a graph given by path, run as is"
