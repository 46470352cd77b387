"""The steps of a run as `agent.iter()` yields them (docs/stepping.md).

    async with agent.iter("What is 17 * 23?") as run:
        async for node in run:
            if isinstance(node, CallModel):
                print(len(node.request.messages), "messages to the model")
    print(run.result.answer)
"""

from tether._iter import AgentRun
from tether._steps import Admit, CallModel, End, Execute, Observe, PlanCalls, Start, Step, StopRun

__all__ = ["Admit", "AgentRun", "CallModel", "End", "Execute", "Observe", "PlanCalls", "Start", "Step", "StopRun"]
