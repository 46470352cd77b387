"""What the model sees: token accounting, compaction, task state, planning, long-term memory.

    from tether.context import Compaction
    compaction = Compaction(summary_model=cheap_model)          # folds at 60% of the window
    agent = Agent(model, tools=[*tools, *compaction.tools()], context=compaction)
    result = agent.run("...")
    result.task_state                                            # the plan and facts, as JSON-able dict

    Planner(agent).run("...")                                    # planner-executor mode
    memory = LongTermMemory.open("memory.db")                   # episodic, semantic, procedural
"""

from tether.context.compaction import Compaction, Compactor, ContextOverflow, cut_result
from tether.context.facts import FactList, message_facts
from tether.context.memory import LongTermMemory, Memory, MemoryStore, SQLiteMemoryStore
from tether.context.planning import Planner, parse_plan
from tether.context.task_state import PlanStep, TaskBoard, TaskState, task_state_tools
from tether.tokens import (
    EstimateCounter,
    MessageSizes,
    TiktokenCounter,
    TokenCounter,
    context_window,
    counter_for,
    message_tokens,
    tools_tokens,
)

__all__ = [
    "Compaction",
    "Compactor",
    "ContextOverflow",
    "EstimateCounter",
    "FactList",
    "LongTermMemory",
    "Memory",
    "MemoryStore",
    "MessageSizes",
    "PlanStep",
    "Planner",
    "SQLiteMemoryStore",
    "TaskBoard",
    "TaskState",
    "TiktokenCounter",
    "TokenCounter",
    "context_window",
    "counter_for",
    "cut_result",
    "message_facts",
    "message_tokens",
    "parse_plan",
    "task_state_tools",
    "tools_tokens",
]
