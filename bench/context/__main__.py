"""Compaction: a replayed 15-step log investigation, with and without compaction and task state.

    python -m bench.context          # prints a table, writes bench/context/results.json

Each of 15 steps searches one service's logs; the tool returns ~3,000 tokens (o200k_base) of log
lines, among them one ERROR line holding that step's clue (a trace id, a host, a version, ...).
The scripted investigator needs the clues of steps 1, 4, 8 and 12 to write its answer: it looks
for each clue's exact text in the request it is sent and fails, naming what is missing, if one is
not there. Every model call reports as input tokens the tokens of the request it was sent
(messages and tool definitions, o200k_base via tiktoken when installed); the summarizer's calls
are counted too. A second, independent measure counts the characters of each request's JSON.

Configurations (same tools, same script):
- plain: the whole transcript every call (FullHistory);
- compacted: `Compaction` (default threshold 60%) + task state; the investigator records each
  clue it reads with `record_fact`, as it is told to;
- compacted, no notes: `Compaction` alone, the investigator records nothing: the clues must survive
  through the summary and the deterministic fact extractor (the scripted summarizer writes only
  which calls were made, so the extractor is what is tested).
Windows: 16k (the bars are checked here: e.g. a local model), 32k and 128k for comparison; at 128k
this task never reaches the threshold, so compaction correctly does nothing.

Also: loop CPU per turn with compaction configured but not triggered, side by side with the plain
loop (bench/overhead's sequential workload, in this same process).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from tether import Agent, Limits, tool
from tether._loop import FullHistory
from tether._tokens import message_tokens, tools_tokens
from tether._types import ModelReply, ModelRequest, ToolCall, Usage, to_jsonable
from tether.context import Compaction, counter_for
from tether.models._scripted import ScriptedModel

OUT = Path(__file__).with_name("results.json")
STEPS = 15
NEEDED = (1, 4, 8, 12)  # the steps whose clues the answer needs
MODEL = "gpt-4o"  # names the tokenizer (o200k_base) the request sizes are counted with
SERVICES = ["gateway", "auth", "orders", "payments", "inventory", "search", "cart", "shipping", "email",
            "billing", "ledger", "fraud", "catalog", "pricing", "reports"]
CLUES = {  # step -> (fact key, clue text, ERROR line)
    1: ("first failing trace", "tr-5f31c9a2", "checkout failed: upstream 503 trace_id=tr-5f31c9a2 user=u-88412"),
    4: ("exhausted pool host", "db-07", "ERROR connection pool exhausted (50/50) on host db-07 pool=orders-rw"),
    8: ("bad deploy", "v2.14.3", "ERROR deploy v2.14.3 rolled out at 2026-11-30T02:58:11Z by ci-runner-4 "
        "changed db.pool.max from 200 to 50"),
    12: ("first alert", "ALRT-20931", "ERROR alert ALRT-20931 fired at 2026-11-30T03:01:47Z p99 latency 8.2s"),
}


def log_page(step: int, target_tokens: int = 3000) -> str:
    """~`target_tokens` of realistic log lines for one step, the step's ERROR clue among them."""
    rng = random.Random(step)
    service = SERVICES[step - 1]
    count = counter_for(MODEL).count
    lines: list[str] = []
    clue = CLUES.get(step, (None, None, f"ERROR retry budget exhausted for job j-{rng.randint(1000, 9999)}"))[2]
    at = rng.randint(5, 40)
    tokens = 0
    while tokens < target_tokens:
        ts = f"2026-11-30T03:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z"
        if len(lines) == at:
            line = f"{ts} {service}-{rng.randint(1, 6)} {clue}"
        elif rng.random() < 0.04:
            line = f"{ts} WARN {service}-{rng.randint(1, 6)} slow request took {rng.randint(900, 2500)}ms"
        else:
            line = (f"{ts} INFO {service}-{rng.randint(1, 6)} request_id=req-{rng.randint(10**7, 10**8)} "
                    f"method={rng.choice(['GET', 'POST'])} path=/v1/{service}/{rng.randint(1, 9999)} "
                    f"status={rng.choice([200, 200, 200, 201, 204, 304])} latency_ms={rng.randint(2, 400)}")
        lines.append(line)
        tokens += count(line) + 1
    return "\n".join(lines)


PAGES = {i: log_page(i) for i in range(1, STEPS + 1)}


@tool(max_result_chars=100_000)
def search_logs(service: str, since: str = "2026-11-30T02:30:00Z") -> str:
    """Search one service's logs from `since` on.

    Args:
        service: the service name, e.g. "orders".
        since: ISO timestamp to start from.
    """
    return PAGES[SERVICES.index(service) + 1]


def request_size(request: ModelRequest) -> tuple[int, int]:
    """(tokens, characters of its JSON) of what a model call was sent."""
    counter = counter_for(MODEL)
    tokens = sum(message_tokens(counter, m) for m in request.messages) + tools_tokens(counter, request.tools)
    chars = len(json.dumps([to_jsonable(m) for m in request.messages])) + len(json.dumps(
        [to_jsonable(t) for t in request.tools]))
    return tokens, chars


class Meter:
    """Adds up what each model call was sent, per model."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.chars: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.peak = 0

    def add(self, who: str, request: ModelRequest) -> Usage:
        tokens, chars = request_size(request)
        self.tokens[who] = self.tokens.get(who, 0) + tokens
        self.chars[who] = self.chars.get(who, 0) + chars
        self.calls[who] = self.calls.get(who, 0) + 1
        self.peak = max(self.peak, tokens)
        return Usage(input_tokens=tokens, output_tokens=20)


def investigator(meter: Meter, notes: bool):
    """The scripted model: one search per step, noting each clue it reads (if `notes`), then the answer."""
    state = {"step": 0}
    noted: set[str] = set()

    def script(request: ModelRequest) -> ModelReply:
        usage = meter.add("main", request)
        state["step"] += 1
        step = state["step"]
        calls: list[ToolCall] = []
        if notes:
            # read the result just returned (the last search result sent) and note its clue once
            last = next((m for m in reversed(request.messages) if m.role == "tool" and m.name == "search_logs"), None)
            for key, clue, _ in CLUES.values():
                hit = None if last is None or clue in noted else next(
                    (x for x in last.content.splitlines() if clue in x), None)
                if hit:
                    noted.add(clue)
                    calls.append(ToolCall(f"f{step}", "record_fact", {"key": key, "value": hit}))
        if step <= STEPS:
            calls.append(ToolCall(f"s{step}", "search_logs", {"service": SERVICES[step - 1]}))
            return ModelReply("", calls, usage)
        if calls:  # the last note first, then the answer
            return ModelReply("", calls, usage)
        seen = "\n".join(m.content for m in request.messages)
        missing = [CLUES[i][1] for i in NEEDED if CLUES[i][1] not in seen]
        if missing:
            return ModelReply(f"FAILED: cannot conclude, missing {', '.join(missing)}", usage=usage)
        return ModelReply(f"Root cause: deploy {CLUES[8][1]} shrank the pool on {CLUES[4][1]}; first failing trace {CLUES[1][1]}, alert {CLUES[12][1]}.", usage=usage)

    return script


def summarizer(meter: Meter):
    """The scripted summary model: lists the calls it was shown, and nothing of their results."""

    def script(request: ModelRequest) -> ModelReply:
        usage = meter.add("summary", request)
        text = request.messages[-1].content
        old = text.split("New steps to fold in:", 1)[0]
        prior = [x for x in old.splitlines() if x.startswith("- searched")]
        new = [f"- searched {s}" for s in re.findall(r'search_logs\(\{"service": "(\w+)"', text)]
        return ModelReply("\n".join(prior + new), usage=usage)

    return script


async def run_one(mode: str, window: int) -> dict[str, Any]:
    meter = Meter()
    notes = mode == "compacted"
    model = ScriptedModel(investigator(meter, notes), name=MODEL)
    tools = [search_logs]
    context: Any = FullHistory()
    compaction: Compaction | None = None
    if mode != "plain":
        compaction = Compaction(window=window, summary_model=ScriptedModel(summarizer(meter), name="summary"))
        context = compaction
        if notes:
            tools = [search_logs, *compaction.tools()]
    agent = Agent(model, tools=tools, context=context, instructions=(
        "You investigate production incidents from logs. Record every clue (ids, hosts, versions, "
        "timestamps) with record_fact as soon as you read it."), limits=Limits(max_steps=60))
    started = time.process_time()
    result = await agent.arun("Checkout has been failing since about 03:00 UTC. Find the root cause.")
    seconds = time.process_time() - started
    answer_ok = result.completed and not result.answer.startswith("FAILED")
    return {
        "mode": mode, "window": window, "success": answer_ok, "answer": result.answer,
        "input_tokens": sum(meter.tokens.values()), "main_input_tokens": meter.tokens.get("main", 0),
        "summary_input_tokens": meter.tokens.get("summary", 0), "input_chars": sum(meter.chars.values()),
        "model_calls": sum(meter.calls.values()), "summary_calls": meter.calls.get("summary", 0),
        "peak_request_tokens": meter.peak, "facts_recorded": len((result.task_state or {}).get("facts", {})),
        "cpu_seconds": round(seconds, 3),
    }


def overhead() -> dict[str, float]:
    """CPU per turn, plain loop vs compaction configured but not triggered, same process."""
    from bench.overhead.__main__ import GUARDS, BenchModel, cpu_per_turn, lookup, stepping_script

    steps, reps = 50, 10
    turns = (steps + 1) * reps

    def runner(context: Any):
        agent = Agent(BenchModel(stepping_script(steps, "lookup")), tools=[lookup], context=context,
                      limits=Limits(max_steps=steps + 5, **GUARDS))

        def go() -> None:
            async def many() -> None:
                for _ in range(reps):
                    assert (await agent.arun("go")).completed
            asyncio.run(many())
        return go

    plain, compacted = runner(FullHistory()), runner(Compaction())
    out = {"plain_us_per_turn": cpu_per_turn(plain, turns), "compaction_idle_us_per_turn": cpu_per_turn(compacted, turns)}
    out["plain_again_us_per_turn"] = cpu_per_turn(plain, turns)  # drift check
    return out


def main() -> int:
    counter = counter_for(MODEL)
    pages = [counter.count(p) for p in PAGES.values()]
    rows = []
    for window in (16_000, 32_000, 128_000):
        for mode in ("plain", "compacted", "compacted_no_notes"):
            if mode == "plain" and rows:
                rows.append({**rows[0], "window": window})  # plain does not depend on the window
                continue
            rows.append(asyncio.run(run_one(mode, window)))
    print(f"tool results: {min(pages)}-{max(pages)} tokens each ({counter.name}); needed clues from steps {NEEDED}")
    print(f"{'window':>7} {'mode':<20} {'ok':<3} {'input tok':>10} {'ratio':>6} {'chars ratio':>11} "
          f"{'calls':>5} {'summ':>4} {'peak':>7}")
    by = {(r["window"], r["mode"]): r for r in rows}
    for r in rows:
        plain = by[(r["window"], "plain")]
        r["ratio_vs_plain"] = round(plain["input_tokens"] / r["input_tokens"], 2)
        r["chars_ratio_vs_plain"] = round(plain["input_chars"] / r["input_chars"], 2)
        print(f"{r['window']:>7} {r['mode']:<20} {'yes' if r['success'] else 'NO':<3} {r['input_tokens']:>10,} "
              f"{r['ratio_vs_plain']:>5}x {r['chars_ratio_vs_plain']:>10}x {r['model_calls']:>5} "
              f"{r['summary_calls']:>4} {r['peak_request_tokens']:>7,}")
    ov = overhead()
    print(f"loop CPU per turn: plain {ov['plain_us_per_turn']:.1f} us, compaction configured but idle "
          f"{ov['compaction_idle_us_per_turn']:.1f} us (plain again {ov['plain_again_us_per_turn']:.1f} us)")
    main_row, plain_row = by[(16_000, "compacted")], by[(16_000, "plain")]
    results = {
        "input_tokens_plain": plain_row["input_tokens"],
        "input_tokens_compacted": main_row["input_tokens"],
        "success_plain": plain_row["success"],
        "success_compacted": main_row["success"],
        "ratio": main_row["ratio_vs_plain"],
        "needed_facts_present_compacted": main_row["success"],
        "window": 16_000,
        "tokenizer": counter.name,
        "tool_result_tokens": [min(pages), max(pages)],
        "bars": {"ratio_at_least_3x": main_row["ratio_vs_plain"] >= 3,
                 "same_success": plain_row["success"] == main_row["success"]},
        "runs": rows,
        "overhead": ov,
    }
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    ok = all(results["bars"].values()) and main_row["success"]
    print(f"bars: >=3x fewer input tokens {'met' if results['bars']['ratio_at_least_3x'] else 'NOT met'}, "
          f"same success {'met' if results['bars']['same_success'] else 'NOT met'}; wrote {OUT}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
