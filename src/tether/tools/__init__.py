"""Tools: a Python callable plus what the model and the executor need to know about it.

    from tether.tools import Tool, ToolContext, tool, Executor, CallContext
    from tether.tools.builtin import calculator, read_tool

The executor (`Executor`) runs every call: validate, the policy's checks, a timeout, a capped result.
"""

from tether.tools._base import Tool, tool
from tether.tools._context import CancelSignal, ToolContext
from tether.tools._declares import Declares
from tether.tools._executor import AllowAll, BasePolicy, CallContext, Executor, Policy, Verdict
from tether.tools._extra import ExtraKey, Extras, RunFacts
from tether.tools._process import run_process
from tether.tools._results import ToolOutput

__all__ = ["AllowAll", "BasePolicy", "CallContext", "CancelSignal", "Declares", "Executor", "ExtraKey", "Extras", "Policy",
           "RunFacts", "Tool", "ToolContext", "ToolOutput", "Verdict", "run_process", "tool"]
