"""The answer filter's cost by value, measured: seconds to redact the known secret values (and all
their encodings) from an answer, by answer size and number of secrets the run read; and the one-off
cost of computing a value's encodings (cached per process).

    python -m bench.secret_values       # prints the figures, writes bench/secret_values/results.json

Each figure is the median of 5 runs; the answers hold no secret (the common case: every needle is
looked for, none is found) and, in `with_leaks`, 10 encoded secrets.
"""

from __future__ import annotations

import base64
import json
import random
import statistics
import string
import time
from pathlib import Path

from tether.policy._leaks import encodings, redact

HERE = Path(__file__).resolve().parent
WORDS = ["the", "config", "region", "eu-west-1", "port", "5432", "database", "runs", "on", "and"]


def _redact_ms(text: str, secrets: dict[str, str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        redact(text, secrets)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def main() -> None:
    rnd = random.Random(1)
    pool = ["".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(20)) for _ in range(500)]
    encodings.cache_clear()
    start = time.perf_counter()
    for value in pool:
        encodings(value)
    first = (time.perf_counter() - start) / len(pool)
    results: dict[str, object] = {"encodings_per_value_ms": round(first * 1000, 3),
                                  "needles_per_value": len(encodings(pool[0])), "redact_ms": {}}
    table: dict[str, float] = {}
    for chars in (3_000, 100_000):
        text = " ".join(rnd.choice(WORDS) for _ in range(chars // 5))[:chars]
        for count in (10, 500):
            secrets = dict.fromkeys(pool[:count], ".env")
            table[f"{chars}_chars_{count}_secrets"] = _redact_ms(text, secrets)
            leaky = text + " " + " ".join(base64.b32encode(v.encode()).decode() for v in pool[:10])
            table[f"{chars}_chars_{count}_secrets_with_leaks"] = _redact_ms(leaky, secrets)
    results["redact_ms"] = table
    print(json.dumps(results, indent=2))
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
