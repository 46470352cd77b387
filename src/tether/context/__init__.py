"""What the model sees: token accounting, compaction, task state, planning, long-term memory.

    from tether.context import Compaction
    compaction = Compaction(summary_model=cheap_model)          # folds at 60% of the window
    agent = Agent(model, tools=[*tools, *compaction.tools()], context=compaction)
    result = agent.run("...")
    result.task_state                                            # the plan and facts, as JSON-able dict

    Planner(agent).run("...")                                    # planner-executor mode
    memory = LongTermMemory.open("memory.db")                   # episodic, semantic, procedural
"""

from tether._tokens import (
    EstimateCounter,
    MessageSizes,
    TiktokenCounter,
    TokenCounter,
    context_window,
    counter_for,
    message_tokens,
    tools_tokens,
)
from tether.context._compaction import Compaction, Compactor, ContextOverflow, cut_result
from tether.context._facts import FactList, message_facts
from tether.context._memory import LongTermMemory, Memory, MemoryStore, SQLiteMemoryStore
from tether.context._planning import Planner, parse_plan
from tether.context._task_state import PlanStep, TaskBoard, TaskState, task_state_tools

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
