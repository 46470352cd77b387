"""The calculator: correct arithmetic, and a clear ValueError for everything it refuses."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether._types import Effect
from tether.tools.builtin import calculator
from tether.tools.builtin._calculator import FUNCTIONS, MAX_CHARS, evaluate


def calc(expression: str) -> str:
    args = calculator.validator.validate({"expression": expression})
    return calculator.fn(**args)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("7 / 2", "3.5"),
        ("2 ** 10", "1024"),
        ("2 ** 3 ** 2", "512"),
        ("-2 ** 2", "-4"),
        ("+-+3", "-3"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("1_000 * 3", "3000"),
        ("2 ** 200", str(2**200)),
        ("2 ** -2", "0.25"),
        ("sqrt(16)", "4.0"),
        ("log(e)", "1.0"),
        ("log(8, 2)", "3.0"),
        ("abs(-3)", "3"),
        ("round(2.675, 2)", "2.67"),
        ("round(1234, -2)", "1200"),
        ("round(2.5)", "2"),
        ("min(3, 1.5, 2)", "1.5"),
        ("max(3, 1.5, 2)", "3"),
        ("floor(-2.5)", "-3"),
        ("ceil(2.1)", "3"),
        ("factorial(20)", str(math.factorial(20))),
        ("factorial(5.0)", "120"),
        ("exp(0)", "1.0"),
        ("cos(0) + sin(0) + tan(0)", "1.0"),
        ("pi", repr(math.pi)),
        ("1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1", "20"),
        ("  3 * 4  ", "12"),
    ],
)
def test_arithmetic(expression: str, expected: str) -> None:
    assert calc(expression) == expected


def test_long_flat_sum_is_not_deep_nesting() -> None:
    terms = list(range(1, 201))
    assert calc("+".join(map(str, terms))) == str(sum(terms))


def test_big_exact_integers_within_bounds() -> None:
    assert calc("factorial(1000)") == str(math.factorial(1000))
    assert calc("2 ** 10000") == str(2**10000)


def test_tool_metadata() -> None:
    assert calculator.name == "calculator"
    assert calculator.effect is Effect.READ_ONLY
    assert calculator.parameters["required"] == ["expression"]
    assert "sqrt" in calculator.description


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty"),
        ("2 ** 10001", "exponent 10001 is too large"),
        ("2 ** 2 ** 2 ** 2 ** 2", "exponent 65536 is too large"),
        ("1.0001 ** 100000", "too large"),
        ("9 ** 10000", "more than 4000 digits"),
        ("(10 ** 3000) * (10 ** 3000)", "more than 4000 digits"),
        ("factorial(1001)", "limit is factorial(1000)"),
        ("factorial(-1)", "non-negative"),
        ("factorial(2.5)", "whole number"),
        ("round(1, 10 ** 9)", "round(x, n) accepts n"),
        ("-" * 150 + "1", "nested too deeply"),
        ("(" * 250 + "1" + ")" * 250, "nested"),
        ("1" * (MAX_CHARS + 1), f"the limit is {MAX_CHARS}"),
        ("x + 1", "unknown name 'x'"),
        ("__builtins__", "unknown name"),
        ("sqrt", "is a function"),
        ("math.sqrt(2)", "attribute access"),
        ("(1).real", "attribute access"),
        ("__import__('os').system('true')", "attribute access"),
        ("eval('1')", "function 'eval' is not allowed"),
        ("open('x')", "function 'open' is not allowed"),
        ("(lambda: 1)()", "only these functions"),
        ("sqrt(x=4)", "positional arguments only"),
        ("max(*[1, 2])", "does not accept *arguments"),
        ("min()", "takes 1 or more"),
        ("sqrt(1, 2)", "takes 1 argument"),
        ("2 ^ 3", "use ** for powers"),
        ("1 << 3", "operator '<<' is not supported"),
        ("~1", "operator '~' is not supported"),
        ("1 < 2", "comparisons"),
        ("1 and 2", "'and'/'or'"),
        ("1 if 1 else 2", "conditional"),
        ("[1, 2]", "lists are not supported"),
        ("(1, 2)", "tuples"),
        ("'a' * 3", "str values are not supported"),
        ("True + 1", "bool values"),
        ("1j", "complex numbers"),
        ("(-8) ** 0.5", "complex number"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("sqrt(-1)", "math domain error"),
        ("log(0)", "math domain error"),
        ("exp(1000)", "overflow"),
        ("1e308 * 10", "overflowed"),
        ("1e400", "overflowed"),
        ("sqrt(10 ** 400)", "overflow"),
        ("x = 1", "not a valid expression"),
        ("import os", "not a valid expression"),
        ("1 +", "not a valid expression"),
        ("a\x00b", "not a valid expression"),
    ],
)
def test_refusals_are_value_errors_with_a_reason(expression: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        calc(expression)
    assert message in str(info.value)


def test_huge_power_refused_before_computing() -> None:
    # 3 ** 10000 fits the exponent cap but not the digit cap; (10**3000)**1000 must be refused by
    # the estimate (computing it would take a very long time).
    with pytest.raises(ValueError, match="4000 digits"):
        evaluate("(10 ** 3000) ** 1000")
    with pytest.raises(ValueError, match="4000 digits"):
        evaluate("3 ** 10000")


def test_validator_rejects_non_string() -> None:
    with pytest.raises(ValueError, match="expression"):
        calculator.validator.validate({"expression": None})


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=2000)
@given(st.text(max_size=MAX_CHARS + 50))
def test_arbitrary_text_only_value_errors(text: str) -> None:
    try:
        result = evaluate(text)
    except ValueError:
        return
    assert isinstance(result, int | float)


_ATOMS = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(["pi", "e", "0", "1", "2", "10", "1e300", "9999"]),
)
_FUNCS = list(FUNCTIONS)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]), children).map(
        lambda t: f"({t[0]}){t[1]}({t[2]})"
    )
    unary = st.tuples(st.sampled_from(["-", "+"]), children).map(lambda t: f"{t[0]}({t[1]})")
    call = st.tuples(st.sampled_from(_FUNCS), st.lists(children, min_size=1, max_size=3)).map(
        lambda t: f"{t[0]}({', '.join(t[1])})"
    )
    return st.one_of(binary, unary, call)


@settings(max_examples=400, deadline=2000)
@given(st.recursive(_ATOMS, _combine, max_leaves=12))
def test_generated_expressions_never_crash_or_hang(expression: str) -> None:
    """Grammar-shaped input hits the arithmetic paths; only ValueError may escape, quickly."""
    try:
        result = evaluate(expression)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(result, int | float)
    if isinstance(result, float):
        assert math.isfinite(result)
    else:
        assert result.bit_length() <= 13_300
