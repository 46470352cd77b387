"""Plan-mode agents for the durable and task-service tests: a scripted planner whose plan pays in a
loop (one effect per iteration, each with its own idempotency key) and then makes a transfer a
person must approve; tools append to a ledger once per idempotency key (`attempts` logs every try).

    python tests/plan_agents.py --db runs.db --ledger ledger.txt --run-id plan1   # a durable worker
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from tether import Limits, tool
from tether.models._scripted import ScriptedModel
from tether.plan import PlanAgent, ask
from tether.tools._base import ToolContext

PLAN = """```python
for i in range(3):
    pay(to="alice", amount=10)
r = transfer(to="savings", amount=100)
final_answer(f"paid 3, transfer {r}")
```"""


def ledger_of() -> Path:
    return Path(os.environ.get("TETHER_TEST_LEDGER", "/tmp/tether-plan-ledger.txt"))


def _once(ledger: Path, line: str, key: str) -> None:
    with ledger.with_name(ledger.name + ".attempts").open("a") as fh:
        fh.write(f"{key}\n")
    if os.environ.get("TETHER_TEST_STALL") == key and not ledger.with_name("stalled").exists():
        ledger.with_name("stalled").write_text(key)  # the test kills the worker here, once
        time.sleep(1200)  # outlasts the test's hang bound (tests/hang.py): only the kill ends it
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    if not any(x.endswith(" " + key) for x in lines):
        with ledger.open("a") as fh:
            fh.write(f"{line} {key}\n")


def build(user: str | None = None, ledger: Path | None = None, durable: Any = None) -> PlanAgent:
    where = ledger or ledger_of()

    @tool(effect="irreversible")
    def pay(to: str, amount: int, context: ToolContext) -> str:
        """Pay someone.

        Args:
            to: who
            amount: how much
        """
        _once(where, f"pay {to} {amount}", context.idempotency_key)
        return "paid"

    @tool(effect="irreversible", metadata={"plan_policy": lambda call: ask("a transfer always needs a person")})
    def transfer(to: str, amount: int, context: ToolContext) -> str:
        """Move money between accounts.

        Args:
            to: the account
            amount: how much
        """
        _once(where, f"transfer {to} {amount}", context.idempotency_key)
        return "done"

    return PlanAgent(ScriptedModel([PLAN]), tools=[pay, transfer], user=user, name="planner", durable=durable,
                     limits=Limits(max_steps=20))


AGENTS = {"planner": build}


async def _work(db: str, ledger: Path, run_id: str) -> int:
    from tether.durable import Durable, runtime

    agent = build("alice", ledger, durable=Durable(db))
    runtime().launch()  # recovers the run a killed worker left pending
    print("launched", flush=True)
    result = await agent.arun("pay alice three times, then move 100 to savings", run_id=run_id)
    print(f"{result.stop_reason.value}: {result.answer}", flush=True)
    return 0 if result.completed else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--run-id", default="plan1")
    a = p.parse_args()
    os._exit(asyncio.run(_work(a.db, Path(a.ledger), a.run_id)))
