"""`call_if`: a call the model writes before anyone reads the data that decides whether it runs.

"If the review says the hotel is rated over 4, book it": with `inspect_value` the model would be shown
the answer (one bit the attacker chose, so the run is tainted and the booking asks a person). With
`call_if` the model writes the whole call first, with its own arguments; the quarantined reader answers
the question about the hidden value, and the call runs only when the answer is the one the model named
(`when`). The model is never told the answer: the outcome comes back as a new hidden value whose
description does not depend on it (a record of fixed size), so the model's context stays as trusted as
it was, and the call's arguments are as the model wrote them, judged by their own labels as any call's
(a handle in them is substituted and labelled when the call runs, not before).

What the data decides: whether this one call runs (one bit), nothing else. Stated limits:
- An attacker who writes the data can make the call happen or not happen (only the call the model
  wrote). A tool that must never run on someone else's say-so is declared
  `@tool(metadata={"conditional": False})`, and call_if refuses it.
- The bit leaves the run by the effect: whoever can observe whether the call ran learns one bit of the
  reader's answer, which the reader computed from the value (and the attacker's text in it may ask for
  any bit of it). A secret value never decides a call (refused before anything is read); a private
  value (one with readers) can give one bit of itself per call_if to whoever observes the call.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tether._errors import InvalidInput, OperationFailed
from tether._types import CallDecision, Effect, ToolCall, ToolResult
from tether.tools._base import Tool, ToolContext, tool
from tether.tools._jobs import is_job
from tether.tools._results import ToolOutput
from tether.values._declare import QUERY_KEY
from tether.values._labels import TRUSTED, Label
from tether.values._query import ask_reader

if TYPE_CHECKING:
    from tether.models._base import Model
    from tether.values._store import ValueStore

CONDITIONAL_TOOL = "call_if"
CONDITIONAL_KEY = "conditional_call"  # Tool.metadata: this tool is call_if
RECORD_CHARS = 4_000  # the outcome's hidden record: always this size, so its size tells nothing
INNER_INDEX = 1_000  # the conditional call's place in its turn: index + this (its own handle, its own key)
_RESULT_CHARS = 3_000  # of the inner call's result, what the record keeps


@dataclass(slots=True)
class Dispatch:
    """What the executor gives a running call_if: the agent's tools, how to run a call through every
    check (the inner call's own policy check, approvals included), and the label of the condition value."""

    tools: dict[str, Tool]
    run: Callable[[ToolCall], Awaitable[ToolResult]]
    label: Label = TRUSTED


DISPATCH: ContextVar[Dispatch | None] = ContextVar("tether_conditional_dispatch", default=None)


def is_conditional(t: Tool) -> bool:
    return bool(t.metadata.get(CONDITIONAL_KEY))


def bind_condition(store: ValueStore, call_id: str, step: int, index: int, arguments: dict[str, Any]) -> dict[str, Any]:
    """call_if's arguments with the condition's handle substituted, and the inner call's `arguments` kept
    as the model wrote them: they are bound (and labelled) when that call runs, by its own check."""
    inner = arguments.get("arguments")
    data = {k: v for k, v in arguments.items() if k != "arguments"}
    bound = store.bind(call_id, step, index, data)
    binding = store.binding(call_id)
    if binding is not None:
        binding.model_args = arguments
    out = dict(bound)
    if "arguments" in arguments:
        out["arguments"] = inner
    return out


def refusal(name: str, t: Tool | None) -> str | None:
    """Why call_if may not run this tool (said before anything is read, so it tells nothing of the data)."""
    if t is None:
        return f"unknown tool '{name}' in call_if"
    if t.metadata.get(QUERY_KEY) or is_conditional(t):
        return f"call_if cannot run '{name}': it runs one call of another tool"
    if t.metadata.get("conditional") is False:
        return f"'{name}' is declared never to run on a condition someone else's data decides; ask about it instead"
    if is_job(t):
        return f"'{name}' runs as a background job, which call_if cannot start"
    return None


def _record(condition: str, name: str, result: ToolResult | None) -> str:
    text = None if result is None else result.content[:_RESULT_CHARS]
    body = json.dumps({"condition": condition, "call": name, "ran": result is not None,
                       "error": bool(result is not None and result.is_error), "result": text}, ensure_ascii=False)
    while len(body) > RECORD_CHARS and text:  # a result of many escaped characters: cut until it fits
        text = text[: len(text) // 2]
        body = json.dumps({"condition": condition, "call": name, "ran": True, "error": bool(result and result.is_error),
                           "result": text}, ensure_ascii=False)
    return body + " " * (RECORD_CHARS - len(body))


def conditional_tool(model: Model, *, name: str = CONDITIONAL_TOOL) -> Tool:
    """The call_if tool: the reader (`model`, given no tools) decides whether one call runs."""

    async def call_if(handle: Any, question: str, answer_type: Literal["boolean", "enum"], when: str, tool: str,
                      arguments: dict[str, Any], context: ToolContext, options: list[str] | None = None) -> ToolOutput:
        """Run one call only if a hidden value says so, without being told what it says. Write the whole
        call now (tool and arguments, which may use handles); a reader with no tools answers question
        about the value (answer_type boolean, or enum with options), and the call runs only when the
        answer equals when. You get back a new hidden value holding whether it ran and its result; you
        are never told which (pass it on, or show it to the user in your answer).

        Args:
            handle: the value that decides, e.g. $v3_1
            question: the yes/no (or which-option) question about it, e.g. "Is it rated over 4?"
            answer_type: boolean or enum
            when: the answer on which the call runs: true or false (boolean), or one of options (enum)
            tool: the tool to call
            arguments: its arguments, as you would write them to call it directly
            options: the allowed answers, for answer_type enum
        """
        dispatch = DISPATCH.get()
        if dispatch is None:
            raise OperationFailed("call_if runs only inside tether's executor")
        if answer_type == "boolean":
            if options:
                raise InvalidInput("options are only for answer_type enum")
            want = {"true": "true", "yes": "true", "false": "false", "no": "false"}.get(str(when).strip().lower())
            if want is None:
                raise InvalidInput("when must be true or false for answer_type boolean")
        elif answer_type == "enum":
            want = next((o for o in options or () if o.strip().lower() == str(when).strip().lower()), None)
            if want is None:
                raise InvalidInput("when must be one of options for answer_type enum")
        else:
            raise InvalidInput("answer_type must be boolean or enum")
        if not isinstance(arguments, dict):
            raise InvalidInput("arguments must be a JSON object: the call's arguments")
        if (why := refusal(tool, dispatch.tools.get(tool))) is not None:
            raise InvalidInput(why)
        if dispatch.label.secret:
            raise InvalidInput("a secret value cannot decide a call: whether it ran would tell one bit of the "
                               "secret to whoever sees the call")
        try:
            answer = await ask_reader(model, handle, question, answer_type, context, options)
        except (OperationFailed, InvalidInput):
            return ToolOutput(_record("undecided", tool, None), untrusted=True)
        if answer != want:
            return ToolOutput(_record("not met", tool, None), untrusted=True)
        result = await dispatch.run(ToolCall(f"{context.call_id}.if", tool, dict(arguments)))
        if result.decision == CallDecision.AWAITING_APPROVAL:
            result = ToolResult(result.call_id, tool, "not run: it needed a person's approval, which a conditional "
                                "call cannot wait for", is_error=True, decision=result.decision)
        return ToolOutput(_record("met", tool, result), untrusted=True)

    return tool(name=name, effect=Effect.READ_ONLY, hide_output=True, metadata={CONDITIONAL_KEY: True})(call_if)
