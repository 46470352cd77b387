"""Which calls hide their output: the one place the declaration is read.

A tool declares it with `@tool(hide_output=True)` / `Tool(..., hide_output=True)` (False: always
visible). Undeclared, a tool hides when it is an untrusted source of other people's text (its
`source` is web, browser, email, mail, messages or mcp), declared `secret_output`, or its output names
its readers (`output_readers=("sender", ...)`: a labelled value keeps them only behind a handle), or declares
`trusted_fields` (its untrusted output is split: those fields shown, the rest behind a handle); files read in a
coding run, shell output and retrieval stay visible. The query tool hides the answers that are free
text (`string` and the patterns), so an answer that could carry instructions comes back as a new
handle; booleans, enums, numbers and dates are shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.tools._base import Tool

HIDDEN_SOURCES = frozenset({"web", "browser", "email", "mail", "messages", "mcp"})
QUERY_KEY = "value_query"  # Tool.metadata: this tool is the quarantined query (tether.values.query_tool)
SHOWN_ANSWERS = frozenset({"boolean", "enum", "number", "date"})
HANDLE_ANSWERS = frozenset({"string", "email", "iban", "url", "regex"})


def hides(tool: Tool, args: dict[str, Any] | None = None) -> bool:
    """Whether a call of `tool` with `args` keeps its output behind a handle when that output is
    untrusted or secret (the safety policy decides which it is)."""
    if tool.metadata.get(QUERY_KEY):
        return isinstance(args, dict) and args.get("answer_type") in HANDLE_ANSWERS
    if tool.hide_output is not None:
        return bool(tool.hide_output)
    declared = tool.declared
    source = str(declared.source or "").lower()
    return source in HIDDEN_SOURCES or bool(declared.secret_output) or isinstance(declared.output_readers, tuple) \
        or bool(declared.trusted_fields)  # declared fields to split off (tether.values._fields)
