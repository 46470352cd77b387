"""Critic vs no critic on 20 recorded tasks with known answers: `python -m bench.critic`.

Each task: the model looks a fact up with a tool, then answers. The replies are recorded (scripted)
ones, chosen to cover what a critic meets: 12 right first answers (4 of them state a number the
model derived, which no tool output contains, so a claim check raises a false alarm), 6 wrong
numbers (a critic should catch them) and 2 wrong non-numeric answers (a claim check cannot). When an
answer is sent back, the recorded second reply is the right answer (for a false alarm: the same
one). Only the deterministic claim check runs here (no reviewer model): a model reviewer needs a
capable model, which this machine does not have. Tokens are estimated (4 characters a token).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from tether import Agent, Limits, tool
from tether._critic import Critic, run_with_critic
from tether.evals._runner import EstimatedUsage
from tether.models._scripted import ScriptedModel, call
from tether.policy import SafetyPolicy

FACTS = {
    "checkout-latency": "checkout p99 latency: 1465 ms (baseline 186 ms)",
    "search-latency": "search p99 latency: 167 ms (baseline 181 ms)",
    "payments-errors": "payments-api error rate: 0.0253 (baseline 0.002)",
    "deploy": "deploy payments-api v2.14.0 at 10:10:12 by ci-bot",
    "first-error": "first 'pool exhausted' error at 10:12:51",
    "oncall-payments": "payments on-call: alice",
    "oncall-search": "discovery on-call: bob",
    "ticket": "opened INC-4031 for team payments",
    "pool": "db.pool.max_size: 5 (was 50)",
    "instances": "payments-api instances: 3 healthy of 3",
    "cpu": "payments-api cpu: 0.22 (baseline 0.45)",
    "rps": "checkout rps: 118",
    "inventory-sku": "inventory error: sku 88213 missing in warehouse feed",
    "cache": "search cache miss ratio 0.42 (threshold 0.30)",
    "auth-owner": "auth owner: identity team",
    "restart-time": "restart took 41 s",
    "queue": "payments queue depth: 412",
    "disk": "checkout disk used: 71%",
    "region": "checkout region: eu-west-1",
    "version-search": "search version: v5.2.1",
}
# (topic, expected substring, first answer, answer after a revision)
TASKS = [
    ("checkout-latency", "1,465", "checkout p99 is 1,465 ms.", None),
    ("search-latency", "167", "search p99 is 167 ms.", None),
    ("deploy", "v2.14.0", "payments-api v2.14.0 was deployed at 10:10:12.", None),
    ("oncall-payments", "alice", "alice is on call for payments.", None),
    ("ticket", "INC-4031", "Opened INC-4031.", None),
    ("auth-owner", "identity", "The identity team owns auth.", None),
    ("region", "eu-west-1", "checkout runs in eu-west-1.", None),
    ("version-search", "v5.2.1", "search runs v5.2.1.", None),
    # right, but with a derived number no tool returned (false alarms for a claim check)
    ("checkout-latency", "1,465", "checkout p99 is 1,465 ms, 1,279 ms above its baseline.", None),
    ("pool", "5", "The pool holds 5 connections, 45 fewer than before.", None),
    ("cpu", "0.22", "CPU is 0.22, about half of the 0.45 baseline (a 51% drop).", None),
    ("payments-errors", "0.0253", "The error rate is 0.0253, about 12 times the 0.002 baseline.", None),
    # wrong numbers (a claim check catches them)
    ("payments-errors", "0.0253", "The error rate is 0.0352.", "The error rate is 0.0253 (baseline 0.002)."),
    ("first-error", "10:12:51", "The first error was at 10:21:15.", "The first error was at 10:12:51."),
    ("instances", "3 healthy", "2 of 3 instances are healthy.", "All 3 instances are healthy (3 healthy of 3)."),
    ("rps", "118", "checkout serves 181 requests a second.", "checkout serves 118 requests a second."),
    ("queue", "412", "The queue depth is 421.", "The queue depth is 412."),
    ("disk", "71%", "checkout disk is 17% used.", "checkout disk is 71% used."),
    # wrong, but nothing numeric to check (a claim check misses them)
    ("oncall-search", "bob", "carol is on call for search.", "bob is on call for search."),
    ("cache", "expected", "The cache is broken; restart search.", "A 0.42 miss ratio is expected after an import."),
]


@tool
def lookup(topic: str) -> str:
    """Look up an operational fact.

    Args:
        topic: the fact's topic
    """
    return FACTS[topic]


async def one(i: int, critic: Critic | None) -> dict:
    topic, expected, first, second = TASKS[i]
    script: list = [call("lookup", topic=topic), first, second or first]
    model = EstimatedUsage(ScriptedModel(script))
    agent = Agent(model, tools=[lookup], policy=SafetyPolicy(), limits=Limits(max_steps=6))
    prompt = f"What do we know about {topic}?"
    result = await (run_with_critic(agent, prompt, critic) if critic else agent.arun(prompt))
    reviews = [e.data for e in result.trace if e.kind == "critic"]
    return {"ok": expected.lower() in result.answer.lower(), "tokens": result.usage.total_tokens,
            "model_calls": result.usage.model_calls, "sent_back": bool(reviews and not reviews[0]["ok"]),
            "first_right": expected.lower() in first.lower()}


async def main_async() -> dict:
    out: dict = {}
    for name, critic in (("no_critic", None), ("claim_check_critic", Critic())):
        started = time.perf_counter()
        rows = [await one(i, critic) for i in range(len(TASKS))]
        out[name] = {
            "tasks": len(rows), "successes": sum(r["ok"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows), "model_calls": sum(r["model_calls"] for r in rows),
            "sent_back": sum(r["sent_back"] for r in rows),
            "false_alarms": sum(r["sent_back"] and r["first_right"] for r in rows),
            "missed_wrong": sum((not r["first_right"]) and not r["sent_back"] for r in rows),
            "seconds": round(time.perf_counter() - started, 3),
        }
    return out


def main() -> None:
    res = asyncio.run(main_async())
    base, crit = res["no_critic"], res["claim_check_critic"]
    print(f"{'setup':22} {'success':>8} {'tokens':>8} {'calls':>6} {'sent back':>10} {'false alarms':>13} {'missed':>7}")
    for name, r in res.items():
        print(f"{name:22} {r['successes']:>5}/{r['tasks']:<2} {r['tokens']:>8} {r['model_calls']:>6} {r['sent_back']:>10} "
              f"{r['false_alarms']:>13} {r['missed_wrong']:>7}")
    print(f"token ratio critic/no critic: {crit['tokens'] / base['tokens']:.2f}")
    res["method"] = __doc__.strip().splitlines()[0]
    res["token_ratio"] = round(crit["tokens"] / base["tokens"], 3)
    Path(__file__).with_name("results.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
