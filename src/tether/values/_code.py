"""Handles and code: a hidden value is never put into an argument a tool declares as code (`code_args`,
Bash's `command`). Spliced into a shell command, a value someone else wrote would be run as code (`;
curl ...`, `$(...)`), and the model, which never saw it, could not know. Such an argument is passed as
written; one that names a handle of the run stops the call with an error saying how to pass the value
as data instead (an argument of its own: Bash's `stdin`). A `$v1_2` naming no value of the run is the
tool's own text (a shell variable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tether._errors import InvalidInput
from tether.values._store import HANDLE, ValueStore

if TYPE_CHECKING:
    from tether.tools._base import Tool


class HandleInCode(InvalidInput):
    """A code argument names a hidden value of the run."""


def bind_data(store: ValueStore, tool: Tool, call_id: str, step: int, index: int,
              arguments: dict[str, Any]) -> dict[str, Any]:
    """`store.bind` over the arguments that are not code; code arguments kept as written. Raises
    HandleInCode when one names a value of the run (and UnknownHandle as `bind` does)."""
    code_args = tool.declared.code_args
    code = [k for k in code_args if isinstance(arguments.get(k), str)] if code_args else None
    if not code:
        return store.bind(call_id, step, index, arguments)
    for name in code:
        named = sorted({f"$v{m.group(1)}_{m.group(2)}" for m in HANDLE.finditer(arguments[name])
                        if store.get(f"$v{m.group(1)}_{m.group(2)}") is not None})
        if named:
            raise HandleInCode(_refusal(tool, name, named))
    data = {k: v for k, v in arguments.items() if k not in code}
    bound = store.bind(call_id, step, index, data)
    binding = store.binding(call_id)
    if binding is not None:
        binding.model_args = arguments  # the call as the model wrote it, code included
    return {k: bound.get(k, v) for k, v in arguments.items()}


def _refusal(tool: Tool, name: str, named: list[str]) -> str:
    refs = ", ".join(named)
    props = tool.spec.parameters.get("properties") or {}
    data = [k for k, v in props.items() if k != name and k not in tool.declared.code_args and _takes_text(v)]
    way = (f"pass the value whole in {' or '.join(data)} (e.g. {data[0]}=\"{named[0]}\") and have the code read it "
           "from there" if data else "this tool takes no value as data; use another tool")
    return (f"its {name} is code, and a hidden value is never put into code ({refs} "
            f"{'is a value' if len(named) == 1 else 'are values'} of this run): {way}. A shell variable of that "
            f"name is written with braces: ${{{named[0][1:]}}}")


def _takes_text(schema: Any) -> bool:
    """Whether an argument's JSON Schema takes a string (`string`, or one of its types or alternatives)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    return any(_takes_text(s) for s in schema.get("anyOf") or ())
