"""JSON Schema from Python signatures (via pydantic) and validation of model-sent arguments.

Two kinds of validator share one interface, `validate(args) -> dict`, raising `ArgumentError`
whose message names the field, what was expected and what came:
- `SignatureValidator` for `@tool` functions (a pydantic model built from the signature);
- `JsonSchemaValidator` for tools declared with an explicit JSON Schema (MCP tools, hand-written
  specs); it covers the subset tool schemas use: type, properties, required, enum, const,
  minimum/maximum (and exclusive), minLength/maxLength, pattern, items, min/maxItems,
  additionalProperties, anyOf/oneOf, and local $ref into $defs.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from tether._errors import InvalidType, TetherError
from tether.tools._context import ToolContext


class ArgumentError(TetherError, ValueError):
    """Arguments that do not fit the tool's schema; the message is written for the model."""


_DOC_PARAM = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (description, {param: description}).

    Understands Google style (`Args:` / `Arguments:` / `Parameters:` sections) and
    reST `:param name: text` lines.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    desc: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        rest = re.match(r":param\s+(\w+)\s*:\s*(.*)", stripped)
        if rest:
            params[rest.group(1)] = rest.group(2).strip()
            current, section = rest.group(1), "params"
            continue
        if stripped.rstrip(":").lower() in {"args", "arguments", "parameters", "params"} and stripped.endswith(":"):
            section, current = "params", None
            continue
        if stripped.rstrip(":").lower() in {"returns", "return", "raises", "yields", "example", "examples"} and stripped.endswith(":"):
            section, current = "other", None
            continue
        if section == "params":
            m = _DOC_PARAM.match(line)
            if m and (line.startswith(" ") or line.startswith("\t") or not current) and not line.startswith("        "):
                name = m.group(1).lstrip("*")
                params[name] = m.group(2).strip()
                current = name
            elif current and stripped:
                params[current] += " " + stripped
            continue
        if section is None:
            desc.append(line)
    return "\n".join(desc).strip(), params


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Inline local `$ref`s so every provider (some reject $defs) sees a flat schema."""
    defs = schema.pop("$defs", {})

    def walk(node: Any, seen: tuple[str, ...] = ()) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.split("/")[-1]
                if name in seen:  # recursive model: leave the ref, keep the defs
                    return node
                target = dict(defs.get(name, {}))
                extra = {k: v for k, v in node.items() if k != "$ref"}
                target.update(extra)
                return walk(target, (*seen, name))
            return {k: walk(v, seen) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, seen) for v in node]
        return node

    out = walk(schema)
    if any("$ref" in str(v) for v in [out]) and defs:
        out["$defs"] = defs
    return out


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's `title` noise and simplify `Optional[X]` to X with a null alternative."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: walk(v) for k, v in node.items() if k != "title" or not isinstance(v, str)}
            return node
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def _is_context_param(annotation: Any) -> bool:
    return annotation is ToolContext


def signature_model(fn: Callable[..., Any], param_docs: dict[str, str]) -> tuple[type[BaseModel], str | None]:
    """Build a pydantic model of `fn`'s parameters; returns (model, name of the context param)."""
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:  # unresolvable forward refs: fail loudly at decoration time
        raise InvalidType(f"cannot read type hints of {fn.__qualname__}: {exc}") from exc
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for name, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidType(f"tool {fn.__qualname__}: *args/**kwargs are not supported in tools")
        annotation = hints.get(name, Any)
        if _is_context_param(annotation):
            context_param = name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        description = param_docs.get(name)
        fields[name] = (annotation, Field(default, description=description) if description else default)
    model = create_model(  # type: ignore[call-overload]
        f"{fn.__name__}_args",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
        **fields,
    )
    return model, context_param


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    schema = _clean(_inline_refs(model.model_json_schema()))
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return schema


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(arguments)"


class SignatureValidator:
    """Validates arguments against a pydantic model built from a function signature."""

    __slots__ = ("model",)

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            obj = self.model.__pydantic_validator__.validate_python(args)  # model_validate without its wrapper
        except ValidationError as exc:
            problems = []
            for err in exc.errors(include_url=False):
                where = _loc(err["loc"])
                if err["type"] == "missing":
                    problems.append(f"'{where}' is required but was not given")
                elif err["type"] == "extra_forbidden":
                    problems.append(f"'{where}' is not a parameter of this tool")
                else:
                    problems.append(f"'{where}': {err['msg']} (got {_describe(err.get('input'))})")
            raise ArgumentError("; ".join(problems)) from None
        # Validated values (coerced, defaults filled), nested models kept as objects.
        return dict(obj.__dict__)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class JsonSchemaValidator:
    """Validates arguments against an explicit JSON Schema (the subset tools use)."""

    __slots__ = ("_defs", "schema")

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self._defs = schema.get("$defs", schema.get("definitions", {}))

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        problems: list[str] = []
        self._check(args, self.schema, "", problems)
        if problems:
            raise ArgumentError("; ".join(problems[:5]))
        out = dict(args)
        for name, sub in self.schema.get("properties", {}).items():
            if name not in out and isinstance(sub, dict) and "default" in sub:
                out[name] = sub["default"]
        return out

    def _type_ok(self, value: Any, expected: str) -> bool:
        if expected in ("integer", "number") and isinstance(value, bool):
            return False
        if expected == "integer" and isinstance(value, float):
            return value.is_integer()
        return isinstance(value, _JSON_TYPES.get(expected, (object,)))

    def _check(self, value: Any, schema: Any, path: str, problems: list[str]) -> None:
        if not isinstance(schema, dict):
            return
        where = path or "(arguments)"
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target = self._defs.get(ref.split("/")[-1])
            if target is not None:
                self._check(value, target, path, problems)
            return
        for key in ("anyOf", "oneOf"):
            if key in schema:
                if not any(self._passes(value, alt, path) for alt in schema[key]):
                    problems.append(f"'{where}': {_describe(value)} matches none of the allowed forms")
                return
        expected = schema.get("type")
        if expected is not None:
            options = expected if isinstance(expected, list) else [expected]
            if not any(self._type_ok(value, t) for t in options):
                problems.append(f"'{where}': expected {' or '.join(options)}, got {_describe(value)}")
                return
        if "enum" in schema and value not in schema["enum"]:
            problems.append(f"'{where}': expected one of {schema['enum']}, got {_describe(value)}")
        if "const" in schema and value != schema["const"]:
            problems.append(f"'{where}': expected {schema['const']!r}, got {_describe(value)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                problems.append(f"'{where}': must be >= {schema['minimum']}, got {value}")
            if "maximum" in schema and value > schema["maximum"]:
                problems.append(f"'{where}': must be <= {schema['maximum']}, got {value}")
            if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
                problems.append(f"'{where}': must be > {schema['exclusiveMinimum']}, got {value}")
            if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
                problems.append(f"'{where}': must be < {schema['exclusiveMaximum']}, got {value}")
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                problems.append(f"'{where}': must have at least {schema['minLength']} characters")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                problems.append(f"'{where}': must have at most {schema['maxLength']} characters")
            if "pattern" in schema and not re.search(schema["pattern"], value):
                problems.append(f"'{where}': must match pattern {schema['pattern']!r}, got {_describe(value)}")
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                problems.append(f"'{where}': must have at least {schema['minItems']} items")
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                problems.append(f"'{where}': must have at most {schema['maxItems']} items")
            items = schema.get("items")
            if isinstance(items, dict):
                for i, item in enumerate(value):
                    self._check(item, items, f"{path}.{i}" if path else str(i), problems)
        if isinstance(value, dict):
            props = schema.get("properties", {})
            for name in schema.get("required", []):
                if name not in value:
                    full = f"{path}.{name}" if path else name
                    problems.append(f"'{full}' is required but was not given")
            extra = schema.get("additionalProperties", True)
            for name, item in value.items():
                full = f"{path}.{name}" if path else name
                if name in props:
                    self._check(item, props[name], full, problems)
                elif extra is False:
                    problems.append(f"'{full}' is not a parameter (allowed: {', '.join(props) or 'none'})")
                elif isinstance(extra, dict):
                    self._check(item, extra, full, problems)

    def _passes(self, value: Any, schema: Any, path: str) -> bool:
        probe: list[str] = []
        self._check(value, schema, path, probe)
        return not probe
