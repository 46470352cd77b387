"""Durable runs on DBOS: the same `run_loop`, its StepRunner swapped for checkpointed steps.

    agent = Agent(model, tools=..., name="support", durable="runs.db")   # or Durable(...), a URL
    result = agent.run("...")          # a DBOS workflow; every model call and tool run a step

A process that starts again recovers its pending runs when DBOS launches (the first durable run,
or `launch()`); `tether resume/approve/cancel/runs` act on them from another process
(tether.durable._control).
"""

from __future__ import annotations

import os
from typing import Any

from tether._errors import InvalidInput
from tether.durable._runtime import Durable, DurableRuns, Runtime, runtime, setup, teardown, wait_result


def attach(agent: Any, durable: Durable | str | os.PathLike[str] | bool) -> DurableRuns:
    """Make `agent` durable: register it under its name, keep its capped results in the run store."""
    from tether.tools._executor import Executor

    if durable is False:
        raise InvalidInput("durable=False: nothing to attach")
    rt = setup(None if durable is True else durable)
    if agent.name in rt.agents and rt.agents[agent.name] is not agent:
        raise InvalidInput(f"a durable agent named {agent.name!r} is already registered; give each a unique name")
    rt.agents[agent.name] = agent
    # capped results must survive a restart: they go to the run store (scoped as in memory)
    old = agent.executor
    tools = [t for name, t in old.tools.items() if name != "read_result"] if old is not None else list(agent.tools)
    agent.executor = Executor(tools, policy=agent.policy, results=rt.store, read_result=bool(tools),
                              max_result_chars=agent.max_result_chars, default_timeout=agent.tool_timeout,
                              max_workers=max(8, agent.limits.max_parallel_tools))
    return DurableRuns(rt)


def launch() -> None:
    """Launch DBOS now (recovering this executor's pending runs); durable runs do it on first use."""
    runtime().launch()


__all__ = ["Durable", "DurableRuns", "Runtime", "attach", "launch", "runtime", "setup", "teardown", "wait_result"]
