"""`Tool` and the `@tool` decorator.

A tool is a Python callable plus what the model and the executor need to know about it: a name,
a description, a JSON Schema for its arguments, its effect class, whether its output is
untrusted, and a timeout. Functions may be sync or async. A parameter annotated `ToolContext`
is filled in by the executor (run id, call id, idempotency key, acting user) and is hidden from
the model.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Unpack, cast, overload

from tether._errors import InvalidInput
from tether._fields import new_dict
from tether._types import Effect, ToolSpec
from tether.tools._context import ToolContext as ToolContext  # re-exported: its public home
from tether.tools._declares import NO_DECLARATIONS, Declares, DeclaresKeywords, legacy_keys, merge_legacy
from tether.tools._schema import (
    JsonSchemaValidator,
    SignatureValidator,
    parse_docstring,
    schema_of,
    signature_model,
)


class ArgsValidator(Protocol):
    def validate(self, args: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(slots=True, eq=False)
class Tool:
    """A callable the model may invoke through the executor."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    validator: ArgsValidator
    effect: Effect = Effect.READ_ONLY
    untrusted_output: bool = False
    timeout: float | None = None
    max_result_chars: int | None = None
    context_param: str | None = None
    is_async: bool = False
    metadata: dict[str, Any] = field(default_factory=new_dict)
    effect_declared: bool = True  # False when `@tool` was not told the effect (the policy fails closed)
    declares: Declares = NO_DECLARATIONS  # what it tells the safety policy (read `declared`)
    # keep an untrusted or secret output behind a handle (tether.values): None, the default for its kind
    hide_output: bool | None = None
    spec: ToolSpec = field(init=False)
    # the deprecated metadata keys last merged into `declared`: (those keys, `declares` then, the result)
    _legacy: tuple[dict[str, Any], Declares, Declares] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.effect = Effect(self.effect)
        self.spec = ToolSpec(self.name, self.description, self.parameters)
        self.is_async = inspect.iscoroutinefunction(self.fn)
        if self.metadata:
            _ = self.declared  # warns now, where the tool is declared, about deprecated metadata keys

    @property
    def declared(self) -> Declares:
        """The tool's declarations: `declares`, with deprecated metadata keys of the same names applied."""
        if not self.metadata:
            return self.declares
        legacy = legacy_keys(self.metadata)
        if not legacy:
            return self.declares
        known = self._legacy
        if known is not None and known[1] is self.declares and known[0] == legacy:
            return known[2]
        if legacy.get("untrusted"):
            self.untrusted_output = True  # the old key for it
        merged = merge_legacy(self.name, self.declares, legacy)
        self._legacy = (legacy, self.declares, merged)
        return merged

    @classmethod
    def from_schema(
        cls,
        name: str,
        description: str,
        parameters: dict[str, Any],
        fn: Callable[..., Any],
        **options: Any,
    ) -> Tool:
        """A tool whose arguments are described by an explicit JSON Schema.

        `fn` is called with the validated arguments as keyword arguments (and `context=` when
        `context_param="context"` is passed in options).
        """
        params = dict(parameters)
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        options.setdefault("effect_declared", "effect" in options)
        return cls(name, description, params, fn, JsonSchemaValidator(params), **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (bypasses the executor; for tests and reuse)."""
        return self.fn(*args, **kwargs)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str | None = None,
    untrusted_output: bool = False,
    timeout: float | None = None,
    max_result_chars: int | None = None,
    metadata: dict[str, Any] | None = None,
    job: bool = False,
    hide_output: bool | None = None,
    declares: Declares | None = None,
    **declarations: Unpack[DeclaresKeywords],
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str | None = None,
    untrusted_output: bool = False,
    timeout: float | None = None,
    max_result_chars: int | None = None,
    metadata: dict[str, Any] | None = None,
    job: bool = False,
    hide_output: bool | None = None,
    declares: Declares | None = None,
    **declarations: Unpack[DeclaresKeywords],
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` from a typed function; the schema comes from its hints and docstring.

    `Literal[...]` becomes an enum, `Annotated[int, Field(ge=1)]` becomes minimum, defaults and
    `X | None` are kept. Use as `@tool` or `@tool(effect="irreversible", timeout=5)`. Without an
    `effect` the tool runs as read-only, but after taint the safety policy checks its calls as if
    it were reversible (declare `effect="read_only"` for a tool that changes nothing). `job=True`
    runs each call in the background and answers it at once with a job id (docs/jobs.md; the same
    as `metadata={"job": True}`). `hide_output=True` keeps an untrusted or secret output out of the
    model's context behind a handle (docs/hidden_values.md); False keeps it visible; None (the default)
    hides it for untrusted sources of others' text (web, mail, MCP) and secret outputs. The other
    keywords are the tool's declarations to the safety policy (`url_args=["url"]`, `private_output=True`,
    ...; see `Declares`), or pass `declares=Declares(...)`.
    """
    declared = declares if declares is not None else NO_DECLARATIONS
    if declarations:
        declared = dataclasses.replace(declared, **cast(dict[str, Any], declarations))

    def build(f: Callable[..., Any]) -> Tool:
        doc_desc, param_docs = parse_docstring(f.__doc__)
        model, context_param = signature_model(f, param_docs)
        return Tool(
            name=name or f.__name__,
            description=description if description is not None else doc_desc,
            parameters=schema_of(model),
            fn=f,
            validator=SignatureValidator(model),
            effect=Effect(effect if effect is not None else Effect.READ_ONLY),
            effect_declared=effect is not None,
            untrusted_output=untrusted_output,
            timeout=timeout,
            max_result_chars=max_result_chars,
            context_param=context_param,
            metadata={**(metadata or {}), **({"job": True} if job else {})},
            declares=declared,
            hide_output=hide_output,
        )

    if fn is not None:
        return build(fn)
    return build


# -- where a parameter's values come from ------------------------------------------------------

# A string parameter's schema may carry {VALUES_KEY: source}. Models that constrain their decoding
# (the embedded model's grammar) offer exactly the values the source yields; other models ignore
# the key, and validation never depends on it.
VALUES_KEY = "x-tether-values"


def files_source(root: str | Path, *, max_files: int = 200) -> dict[str, Any]:
    """Values: the paths (relative to `root`) of the files under it, when there are at most `max_files`."""
    return {"from": "files", "root": str(Path(root).expanduser().resolve()), "max": max_files}


def request_words_source(*, max_words: int = 8) -> dict[str, Any]:
    """Values: up to `max_words` words taken from the user's latest request, in any order."""
    return {"from": "request", "max_words": max_words}


def request_spans_source(pattern: str) -> dict[str, Any]:
    """Values: the pieces of the user's latest request that match `pattern` (a Python regex), when
    there are any (e.g. the arithmetic written in "What is 17 * 23?")."""
    return {"from": "request", "match": pattern}


def values_from(t: Tool, param: str, source: dict[str, Any]) -> Tool:
    """Declare where `param`'s values come from (see `files_source`, `request_words_source`)."""
    props: dict[str, Any] = t.parameters.get("properties") or {}
    if param not in props:
        raise InvalidInput(f"tool {t.name!r} has no parameter {param!r}")
    props[param] = {**props[param], VALUES_KEY: {**source, "param": param}}
    t.spec = ToolSpec(t.name, t.description, t.parameters)
    return t
