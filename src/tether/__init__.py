"""tether: a bounded, safe, durable and testable runtime for tool-using LLM agents."""

import sys as _sys

if _sys.argv[:1] == ["-m"]:
    # `python -m tether` / `python -m tether.cli` (Python sets argv[0] to "-m" while it imports the
    # package): the working directory, which the agent writes, may be on sys.path. Refuse if something
    # was already imported from it, else drop it before anything else is imported.
    from tether._start import guard_module_run as _guard
    from tether._start import quiet_ctrl_c_while_starting as _quiet

    _guard()
    _quiet()

from tether import _compat, models
from tether._agent import Agent
from tether._critic import Critic, run_with_critic
from tether._errors import (
    InvalidInput,
    InvalidType,
    MissingDependency,
    MissingFile,
    NotFound,
    OperationFailed,
    TetherError,
)
from tether._limits import Limits
from tether._loop import CancelToken
from tether._output import JsonSchema, OutputInvalid, structured
from tether._types import (
    CallDecision,
    Effect,
    Message,
    ModelReply,
    ModelRequest,
    RunResult,
    RunState,
    StopReason,
    ToolCall,
    Usage,
)
from tether.events import TraceEvent
from tether.models._base import Model, ModelError
from tether.models._fallback import FallbackModel
from tether.models._scripted import ScriptedModel, call, reply
from tether.policy import SafetyPolicy
from tether.tools._base import Tool, ToolContext, tool
from tether.tools._executor import AllowAll, BasePolicy, CallContext, Policy, Verdict
from tether.tools._extra import ExtraKey, Extras
from tether.tools._results import ToolOutput

_compat.install()  # old module paths (tether.models.scripted, ...) still import, with a DeprecationWarning

__all__ = [
    "Agent",
    "AllowAll",
    "BasePolicy",
    "CallContext",
    "CallDecision",
    "CancelToken",
    "Critic",
    "Effect",
    "ExtraKey",
    "Extras",
    "FallbackModel",
    "InvalidInput",
    "InvalidType",
    "JsonSchema",
    "Limits",
    "Message",
    "MissingDependency",
    "MissingFile",
    "Model",
    "ModelError",
    "ModelReply",
    "ModelRequest",
    "NotFound",
    "OperationFailed",
    "OutputInvalid",
    "Policy",
    "RunResult",
    "RunState",
    "SafetyPolicy",
    "ScriptedModel",
    "StopReason",
    "TetherError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolOutput",
    "TraceEvent",
    "Usage",
    "Verdict",
    "call",
    "models",
    "reply",
    "run_with_critic",
    "structured",
    "tool",
]
__version__ = "0.1.0"
