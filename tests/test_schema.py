"""Schemas from signatures, docstrings, and the explicit JSON Schema validator."""

from __future__ import annotations

import contextlib
from typing import Annotated, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from tether import tool
from tether.tools._schema import ArgumentError, JsonSchemaValidator, parse_docstring


class Address(BaseModel):
    city: str
    zip: str | None = None


@tool
def book(
    city: str,
    nights: Annotated[int, Field(ge=1, le=30)],
    room: Literal["single", "double"] = "single",
    code: Annotated[str, Field(pattern=r"^[A-Z]{3}$")] = "AAA",
    note: str | None = None,
    billing: Address | None = None,
) -> str:
    """Book a hotel.

    Args:
        city: where to stay
        nights: how many nights
            (continued description)
    """
    return city


def test_schema_from_signature():
    p = book.parameters
    assert book.description == "Book a hotel."
    assert p["type"] == "object" and p["required"] == ["city", "nights"]
    assert p["additionalProperties"] is False
    props = p["properties"]
    assert props["city"] == {"type": "string", "description": "where to stay"}
    assert props["nights"]["minimum"] == 1 and props["nights"]["maximum"] == 30
    assert props["nights"]["description"] == "how many nights (continued description)"
    assert props["room"] == {"enum": ["single", "double"], "type": "string", "default": "single"}
    assert props["code"]["pattern"] == "^[A-Z]{3}$"
    assert props["note"]["default"] is None
    assert "$defs" not in p  # nested models inlined
    assert "city" in str(props["billing"])


def test_signature_validation():
    args = book.validator.validate({"city": "Oslo", "nights": "3", "billing": {"city": "Oslo"}})
    assert args["nights"] == 3 and args["room"] == "single" and args["billing"].city == "Oslo"
    with pytest.raises(ArgumentError, match="'room'"):
        book.validator.validate({"city": "Oslo", "nights": 3, "room": "suite"})
    with pytest.raises(ArgumentError, match=r"'nights'.*less than or equal to 30"):
        book.validator.validate({"city": "Oslo", "nights": 31})


def test_docstring_styles():
    assert parse_docstring(":param x: the x\n:param y: the y") == ("", {"x": "the x", "y": "the y"})
    desc, params = parse_docstring("Do it.\n\nMore.\n\nReturns:\n    nothing")
    assert desc == "Do it.\n\nMore." and params == {}


def test_varargs_are_refused():
    with pytest.raises(TypeError, match=r"\*args"):
        tool(lambda *a: None)


def test_json_schema_validator_subset():
    v = JsonSchemaValidator({
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            "mode": {"enum": ["a", "b"]},
            "n": {"type": "integer", "exclusiveMaximum": 10},
            "ref": {"$ref": "#/$defs/R"},
            "either": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "$defs": {"R": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
    })
    assert v.validate({"tags": ["a"], "n": 3, "ref": {"x": 1.5}, "either": None})
    with pytest.raises(ArgumentError) as err:
        v.validate({"tags": ["a", 1, "c"], "mode": "z", "n": 10, "ref": {}, "either": "s"})
    msg = str(err.value)
    assert "'tags.1': expected string" in msg and "at most 2 items" in msg
    assert "expected one of ['a', 'b']" in msg and "must be < 10" in msg and "'ref.x' is required" in msg
    assert v.validate({"n": 4.0})  # JSON integers may arrive as 4.0
    with pytest.raises(ArgumentError):
        v.validate({"n": True})  # a bool is not an integer


@given(st.dictionaries(st.text(max_size=5), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=10)))
def test_validators_raise_only_argument_error(args):
    for validate in (book.validator.validate, JsonSchemaValidator(book.parameters).validate):
        with contextlib.suppress(ArgumentError):
            validate(args)
