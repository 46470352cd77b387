"""Structured output: a run (or one call) whose answer is a validated Python object.

    agent = Agent(model, output_type=Invoice)        # result.output is an Invoice
    city = await structured(model, "Capital of France?", str)

`output_type` may be a pydantic model, a dataclass, a TypedDict, a primitive, `list[...]`, a union
of those, or `JsonSchema({...})` for a raw JSON Schema (the CLI's `--output-schema`). It is
compiled once (`OutputType.of`) into the `OutputSchema` a request carries; the root of that schema
is always an object, so a type that is not one is wrapped as `{"result": ...}` (a bare value is
accepted back too).

How the model is held to the schema: an adapter with `native_output = True` renders the request's
`output_schema` itself (OpenAI `response_format`, Anthropic a forced final tool, the embedded model
a grammar); for every other model `request_for` offers a `final_result` tool whose arguments are
the answer. Either way the reply is validated here, and an invalid one goes back to the model with
its errors (field, what was expected, what came) `retries` times; each retry is a model call, so
it is counted in the run's budget like any other.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from functools import cache
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import TypeAdapter, ValidationError

from tether._errors import InvalidInput, TetherError
from tether._types import Message, ModelReply, ModelRequest, OutputSchema, StopReason, ToolSpec, Usage
from tether.models._base import Model
from tether.models._pricing import Pricing
from tether.tools._schema import ArgumentError, JsonSchemaValidator

T = TypeVar("T")

FINAL_TOOL = "final_result"
DEFAULT_RETRIES = 2
_GOT_CHARS = 80
_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)

Verdict = Literal["valid", "retry", "invalid", "tools"]


class OutputInvalid(TetherError, ValueError):
    """No reply validated against the output type within the retries (from `structured`)."""

    def __init__(self, errors: Sequence[str], text: str, attempts: int) -> None:
        self.errors = list(errors)
        self.text = text
        self.attempts = attempts
        super().__init__(f"no valid output after {attempts} attempt(s): " + "; ".join(self.errors))


class JsonSchema:
    """A raw JSON Schema as an output type; the output is the parsed JSON.

    Validated with the executor's `JsonSchemaValidator` (the subset tool schemas use: types,
    properties, required, additionalProperties, items, enum, const, anyOf/oneOf, $ref, bounds,
    lengths, pattern); other keywords are not enforced.
    """

    def __init__(self, schema: dict[str, Any], name: str = FINAL_TOOL) -> None:
        if not isinstance(schema, dict):
            raise InvalidInput(f"a JSON Schema must be an object, got {type(schema).__name__}")
        kind = schema.get("type")
        if kind is not None and not isinstance(kind, str | list):
            raise InvalidInput(f"the schema's `type` must be a string or a list, got {kind!r}")
        self.schema = schema
        self.name = name
        self.request_schema, self.wrapped = _object_root(schema)
        self._validator = JsonSchemaValidator(self.request_schema)

    def errors(self, data: Any) -> list[str]:
        if not self.wrapped and not isinstance(data, dict):
            return [f"(root): expected object, got {_got(data)}"]
        try:
            self._validator.validate({"result": data} if self.wrapped else data)
        except ArgumentError as exc:
            return [str(exc).replace("'result.", "'").replace("'result'", "'(root)'")]
        return []


class _Invalid(Exception):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class OutputType(Generic[T]):
    """An output type compiled once: its request schema and its validator."""

    tp: Any
    schema: OutputSchema
    wrapped: bool  # the schema is {"result": <tp's schema>}
    plain_text: bool  # `str`: a reply that is not JSON is taken as the string itself
    _adapter: TypeAdapter[T] | None
    _raw: JsonSchema | None

    @staticmethod
    def of(tp: Any) -> OutputType[Any]:
        """Compile `tp` (cached per type); ValueError with one line if it has no JSON Schema."""
        if isinstance(tp, JsonSchema):
            return _compile_raw(tp)
        try:
            return _compile(tp)
        except TypeError:  # unhashable (e.g. an Annotated with a dict in it): compile uncached
            return _compile.__wrapped__(tp)

    def validate(self, data: Any) -> T:
        """The validated value of parsed JSON `data`; raises _Invalid with one line per error."""
        if self.wrapped and isinstance(data, dict) and len(data) == 1 and "result" in data:
            data = data["result"]
        if self._raw is not None:
            errors = self._raw.errors(data)
            if errors:
                raise _Invalid(errors)
            return cast(T, data)  # a raw JSON Schema's type is the JSON itself
        assert self._adapter is not None
        try:
            return self._adapter.validate_python(data)
        except ValidationError as exc:
            raise _Invalid(pydantic_errors(exc)) from None

    def parse_text(self, text: str) -> T:
        """Validate a text reply: JSON, optionally in a ``` fence (for `str`, any text)."""
        data = parse_json(text)
        if data is not _NOT_JSON:
            try:
                return self.validate(data)
            except _Invalid:
                if not self.plain_text:
                    raise
        if self.plain_text and text.strip():  # `str`: "42" or prose is the string itself
            return text.strip()  # type: ignore[return-value]
        raise _Invalid([f"(root): expected a JSON value matching the schema, got text {_got(text)}"])


@cache
def _compile(tp: Any) -> OutputType[Any]:
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(tp)
        schema = adapter.json_schema()
    except Exception as exc:  # pydantic raises several kinds for types it cannot describe
        raise InvalidInput(f"output_type {tp!r} has no JSON Schema: {_clip(str(exc), 200)}") from None
    name = FINAL_TOOL
    wrapped_schema, wrapped = _object_root(schema)
    description = str(schema.get("description") or "")
    # Pydantic leaves objects open; a closed copy is what OpenAI's strict mode (the provider enforcing
    # the schema) needs, and validation is unchanged (extra keys were ignored, now none are sent).
    closed = _closed(wrapped_schema)
    strict = _strict_ok(closed)
    out = OutputSchema(name, closed if strict else wrapped_schema, description, strict=strict)
    return OutputType(tp, out, wrapped, tp is str, adapter, None)


def _compile_raw(raw: JsonSchema) -> OutputType[Any]:
    schema = raw.request_schema
    out = OutputSchema(raw.name, schema, str(raw.schema.get("description") or ""), strict=_strict_ok(schema))
    return OutputType(raw, out, raw.wrapped, False, None, raw)


def _object_root(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Providers want an object at the root: other schemas go under a `result` key ($defs stay on top)."""
    if schema.get("type") == "object" and "properties" in schema:
        return schema, False
    inner = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    wrapped: dict[str, Any] = {"type": "object", "properties": {"result": inner}, "required": ["result"],
                               "additionalProperties": False}
    for key in ("$defs", "definitions"):
        if key in schema:
            wrapped[key] = schema[key]
    return wrapped, True


def _closed(schema: Any) -> Any:
    """A copy with `additionalProperties: false` on every object schema that does not say otherwise."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k == "enum" else _closed(v)) for k, v in schema.items()}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _strict_ok(schema: Any) -> bool:
    """Whether the schema already fits OpenAI's strict mode: every object closed, every key required."""
    if isinstance(schema, list):
        return all(_strict_ok(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False or set(schema.get("required") or []) != set(props):
            return False
    if "default" in schema:
        return False
    return all(_strict_ok(v) for k, v in schema.items() if isinstance(v, dict | list) and k != "enum")


def pydantic_errors(exc: ValidationError) -> list[str]:
    """One line per error: where, what was expected, what came."""
    lines = []
    for err in exc.errors(include_url=False):
        where = _path(err.get("loc", ()))
        if err.get("type") == "missing":
            lines.append(f"{where}: required field missing")
        else:
            lines.append(f"{where}: {err.get('msg', 'invalid')} (got {_got(err.get('input'))})")
    return lines[:20]


def _path(loc: Any) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


def _got(value: Any) -> str:
    """What came, as JSON, cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return _clip(text, _GOT_CHARS)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_NOT_JSON = object()


def parse_json(text: str) -> Any:
    """The JSON value in a reply (a ``` fence or prose around one object tolerated), or _NOT_JSON."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            try:
                return json.loads(text[start : end + 1])
            except ValueError:
                continue
    return _NOT_JSON


# ----- requests ------------------------------------------------------------------------------------


def final_tool(schema: OutputSchema) -> ToolSpec:
    """The tool whose arguments are the answer (for models without native structured output)."""
    text = "Give your final answer by calling this tool; its arguments are the answer."
    if schema.description:
        text += " " + schema.description
    return ToolSpec(schema.name, text, schema.schema)


def request_for(model: Model, request: ModelRequest) -> ModelRequest:
    """`request` as `model` can take it: unchanged if it renders `output_schema` natively, else
    with the schema turned into a final tool the model must call (`tool_choice="required"`, or
    that tool by name when the request allows no tool calls: `tool_choice="none"`)."""
    schema = request.output_schema
    if schema is None or getattr(model, "native_output", False):
        return request
    choice = schema.name if request.tool_choice == "none" else "required"
    return dataclasses.replace(request, tools=[*request.tools, final_tool(schema)], tool_choice=choice,
                               output_schema=None)


# ----- one run's output state ----------------------------------------------------------------------


class OutputRun:
    """Validates the answers of one run (or one `structured` call) and keeps the retry count.

    `check` is called on every reply; the loop acts on its verdict: "tools" (ordinary tool calls,
    carry on), "valid" (`value` and `text` are set), "retry" (the errors were appended to the
    transcript for the model), "invalid" (no retries left; `text` is the best partial answer).
    """

    __slots__ = ("attempts", "errors", "kind", "retries_left", "text", "tool_mode", "valid", "value")

    def __init__(self, kind: OutputType[Any], retries: int = DEFAULT_RETRIES) -> None:
        if retries < 0:
            raise InvalidInput(f"output retries must be >= 0, got {retries}")
        self.kind = kind
        self.retries_left = retries
        self.attempts = 0
        self.errors: list[str] = []
        self.text = ""
        self.value: Any = None
        self.valid = False
        self.tool_mode = False

    def prepare(self, model: Model, request: ModelRequest) -> ModelRequest:
        """Ask `model` for this output in `request` (natively or through the final tool)."""
        request.output_schema = self.kind.schema
        out = request_for(model, request)
        self.tool_mode = out.output_schema is None
        return out

    def check(self, reply: ModelReply, messages: list[Message], *, tools_allowed: bool = True) -> Verdict:
        """Judge one reply (already appended to `messages`); answers its final-tool calls in `messages`."""
        final = next((c for c in reply.tool_calls if c.name == self.kind.schema.name), None)
        if final is None and reply.tool_calls and tools_allowed:
            return "tools"
        text = ""
        try:
            if final is not None:
                if final.parse_error:
                    text = final.raw_arguments or ""
                    raise _Invalid([f"(root): {final.parse_error}"])
                text = json.dumps(final.arguments, ensure_ascii=False)
                value = self.kind.validate(final.arguments)
            else:
                text = reply.text
                if reply.tool_calls:
                    raise _Invalid(["(root): no tools are available here; answer with the JSON value only"])
                value = self.kind.parse_text(text)
        except _Invalid as bad:
            self.attempts += 1
            self.errors = bad.errors
            if text.strip():
                self.text = text
            retry = self.retries_left > 0
            if retry:
                self.retries_left -= 1
            verdict = "ERROR: " + self._feedback(True) if retry else "ERROR: not accepted; the run is stopping."
            _answer_calls(messages, reply, final, verdict)
            if retry and final is None:
                messages.append(Message.user(self._feedback(False)))
            return "retry" if retry else "invalid"
        self.value, self.valid, self.text = value, True, text
        _answer_calls(messages, reply, final, "Final result accepted.")
        return "valid"

    def accept_final(self, reply: ModelReply) -> str:
        """The budget-stop partial answer (one tool-free call, no retry): valid output if it is one."""
        final = next((c for c in reply.tool_calls if c.name == self.kind.schema.name), None)
        text = json.dumps(final.arguments, ensure_ascii=False) if final is not None else reply.text
        try:
            value = self.kind.validate(final.arguments) if final is not None else self.kind.parse_text(text)
        except _Invalid as bad:
            self.attempts += 1
            self.errors = bad.errors
            return text
        self.value, self.valid, self.text = value, True, text
        return text

    def finish(self, stop: StopReason, error: str | None, answer: str) -> tuple[StopReason, str | None, Any]:
        """(stop reason, error, output) for the RunResult, after the output filter made `answer`:
        an answer it changed is validated again, so the output never carries what it removed."""
        if self.valid and answer != self.text:
            try:
                self.value = self.kind.parse_text(answer)
            except _Invalid as bad:
                self.valid, self.errors = False, bad.errors
                return StopReason.OUTPUT_INVALID, "the output filter changed the answer and it no longer " \
                    "validates: " + "; ".join(bad.errors), None
        if self.valid:
            return stop, error, self.value
        if self.attempts and stop not in (StopReason.ERROR, StopReason.CANCELLED, StopReason.AWAITING_APPROVAL):
            why = f"no valid output after {self.attempts} attempt(s): " + "; ".join(self.errors)
            if stop is not StopReason.OUTPUT_INVALID:
                why += f" (the run stopped at its limit: {stop.value})"
            return StopReason.OUTPUT_INVALID, error or why, None
        return stop, error, None

    def _feedback(self, as_tool: bool) -> str:
        errors = "\n".join(f"- {e}" for e in self.errors)
        head = "Your final answer does not match the required output schema:\n" + errors + "\n"
        if as_tool:
            return head + f"Call {self.kind.schema.name} again with corrected arguments."
        if self.tool_mode:
            return head + f"Give the corrected answer by calling the {self.kind.schema.name} tool."
        return head + "Reply again with only the corrected JSON, nothing else."


def _answer_calls(messages: list[Message], reply: ModelReply, final: Any, final_text: str) -> None:
    """One tool message per call of `reply`, so the transcript stays valid: the final-tool call gets
    `final_text`; any other call in the same turn is not run (the answer ends the turn)."""
    for call in reply.tool_calls:
        if call is final:
            messages.append(Message("tool", final_text, tool_call_id=call.id, name=call.name))
        else:
            messages.append(Message("tool", "ERROR: not run: only the final answer is taken from this turn.",
                                    tool_call_id=call.id, name=call.name))


# ----- one-off structured calls ---------------------------------------------------------------------


async def structured(
    model: Model,
    prompt: str | Sequence[Message],
    output_type: type[T],
    *,
    instructions: str = "",
    retries: int = DEFAULT_RETRIES,
    max_output_tokens: int | None = None,
    temperature: float | None = None,
    usage: Usage | None = None,
    pricing: Pricing | None = None,
) -> T:
    """One structured call, no tools and no loop: the validated `output_type` value.

    An invalid reply goes back with its errors `retries` times, then `OutputInvalid` is raised.
    `usage`, if given, is added to (tokens, priced cost, model calls) for the caller's accounting.
    """
    run = OutputRun(OutputType.of(output_type), retries)
    messages = [Message.system(instructions)] if instructions else []
    messages += [Message.user(prompt)] if isinstance(prompt, str) else list(prompt)
    prices = pricing or Pricing()
    while True:
        request = run.prepare(model, ModelRequest(messages, max_output_tokens=max_output_tokens,
                                                  temperature=temperature))
        reply = await model.complete(request)
        if usage is not None:
            name = reply.model or model.name
            cost = prices.usage_cost(name, reply.usage) if prices.known(name) else reply.usage.cost_usd
            usage.add(dataclasses.replace(reply.usage, cost_usd=cost, model_calls=1))
        messages.append(reply.to_message())
        verdict = run.check(reply, messages, tools_allowed=False)
        if verdict == "valid":
            value: T = run.value  # validated against output_type
            return value
        if verdict == "invalid":
            raise OutputInvalid(run.errors, run.text, run.attempts)


