"""tether: a bounded, safe, durable and testable runtime for tool-using LLM agents."""

from tether import models
from tether.agent import Agent
from tether.limits import Limits
from tether.loop import CancelToken
from tether.output import JsonSchema, OutputInvalid, structured
from tether.tools.base import Tool, ToolContext, tool
from tether.types import Effect, Message, ModelReply, RunResult, StopReason, ToolCall, Usage

__all__ = [
    "Agent",
    "CancelToken",
    "Effect",
    "JsonSchema",
    "Limits",
    "Message",
    "ModelReply",
    "OutputInvalid",
    "RunResult",
    "StopReason",
    "Tool",
    "ToolCall",
    "ToolContext",
    "Usage",
    "models",
    "structured",
    "tool",
]
__version__ = "0.1.0"
