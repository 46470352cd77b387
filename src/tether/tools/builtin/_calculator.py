"""`calculator`: arithmetic evaluated on the Python AST (never `eval`).

Only numbers, `+ - * / // % **`, unary signs, parentheses and a whitelist of math functions and
constants are accepted. Everything that could take unbounded time or memory is refused up front:
long input, deep nesting, huge powers and products, big factorials. Every refusal and every
arithmetic failure is a `ValueError` whose message tells the model what to change.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field

from tether._errors import InvalidInput
from tether.tools._base import ArgsValidator, request_spans_source, tool, values_from
from tether.tools._schema import ArgumentError

MAX_CHARS = 1_000
MAX_DEPTH = 100
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 1_000
MAX_DIGITS = 4_000  # below CPython's 4,300-digit int->str limit
MAX_INT_BITS = int(MAX_DIGITS * math.log2(10))
MAX_ROUND_DIGITS = 100

Number = int | float


def _factorial(n: Number) -> int:
    if isinstance(n, float):
        if not n.is_integer():
            raise InvalidInput(f"factorial needs a whole number, got {n!r}")
        n = int(n)
    if n < 0:
        raise InvalidInput(f"factorial needs a non-negative number, got {n}")
    if n > MAX_FACTORIAL:
        raise InvalidInput(f"factorial({n}) is too large; the limit is factorial({MAX_FACTORIAL})")
    return math.factorial(n)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise InvalidInput(f"round(x, n) needs a whole number n, got {ndigits!r}")
    if abs(ndigits) > MAX_ROUND_DIGITS:
        raise InvalidInput(f"round(x, n) accepts n between -{MAX_ROUND_DIGITS} and {MAX_ROUND_DIGITS}")
    return round(x, ndigits)


# name -> (function, min args, max args or None for any)
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None]] = {  # each returns a Number
    "sqrt": (math.sqrt, 1, 1),
    "log": (math.log, 1, 2),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "exp": (math.exp, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (min, 1, None),
    "max": (max, 1, None),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "factorial": (_factorial, 1, 1),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}

_ALLOWED = f"functions {', '.join(FUNCTIONS)}; constants {', '.join(CONSTANTS)}"

_BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}

_UNSUPPORTED: dict[type[ast.AST], str] = {
    ast.Compare: "comparisons are not supported",
    ast.BoolOp: "'and'/'or' are not supported",
    ast.IfExp: "conditional expressions are not supported",
    ast.Lambda: "lambdas are not allowed",
    ast.Subscript: "indexing is not allowed",
    ast.List: "lists are not supported; pass numbers directly, e.g. max(1, 2, 3)",
    ast.Tuple: "tuples are not supported; write a single expression",
    ast.Set: "sets are not supported",
    ast.Dict: "dicts are not supported",
    ast.JoinedStr: "strings are not supported",
    ast.NamedExpr: "assignment is not allowed",
    ast.ListComp: "comprehensions are not allowed",
    ast.GeneratorExp: "comprehensions are not allowed",
    ast.SetComp: "comprehensions are not allowed",
    ast.DictComp: "comprehensions are not allowed",
    ast.Await: "await is not allowed",
}


def _short(value: Number) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} chars)"


def _check_int(value: Number, what: str) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise InvalidInput(
            f"{what} has more than {MAX_DIGITS} digits; the calculator refuses numbers that large"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{what} overflowed to {value!r}; the numbers are too large for floating point")
    return value


def _pow(base: Number, exp: Number) -> Number:
    if abs(exp) > MAX_EXPONENT:
        raise InvalidInput(f"exponent {exp!r} is too large; the limit is {MAX_EXPONENT}")
    # |base| ** exp has at least (bit_length(base) - 1) * exp bits; refuse before computing it.
    if (
        isinstance(base, int)
        and isinstance(exp, int)
        and exp > 0
        and (base.bit_length() - 1) * exp > MAX_INT_BITS
    ):
        raise InvalidInput(
            f"{_short(base)} ** {exp} would have more than {MAX_DIGITS} digits; the calculator refuses it"
        )
    result = base**exp
    if isinstance(result, complex):
        raise InvalidInput(
            f"({_short(base)}) ** {_short(exp)} is a complex number; only real results are supported"
        )
    return result


def _binop(op: str, a: Number, b: Number) -> Number:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
            raise InvalidInput(
                f"the product would have more than {MAX_DIGITS} digits; the calculator refuses it"
            )
        return a * b
    if op == "/":
        return a / b
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    return _pow(a, b)


class _Evaluator:
    def eval(self, node: ast.AST, depth: int = 0) -> Number:
        if depth > MAX_DEPTH:
            raise InvalidInput(
                f"expression is nested too deeply (over {MAX_DEPTH} levels); split it into smaller steps"
            )
        if isinstance(node, ast.Expression):
            return self.eval(node.body, depth + 1)
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, int | float):
                kind = "complex numbers" if isinstance(value, complex) else f"{type(value).__name__} values"
                raise InvalidInput(f"{kind} are not supported; only real numbers")
            return _check_int(value, "a number in the expression")
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand, depth + 1)
            if isinstance(node.op, ast.USub):
                return -operand
            if isinstance(node.op, ast.UAdd):
                return +operand
            raise InvalidInput(f"operator '{_op_text(node.op)}' is not supported; use + - * / // % **")
        if isinstance(node, ast.BinOp):
            return self._chain(node, depth)
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS:
                return CONSTANTS[node.id]
            if node.id in FUNCTIONS:
                raise InvalidInput(f"'{node.id}' is a function; call it like {node.id}(2)")
            raise InvalidInput(f"unknown name '{node.id}'; allowed are {_ALLOWED}")
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        if isinstance(node, ast.Attribute):
            raise InvalidInput(
                f"attribute access ('.{node.attr}') is not allowed; call functions by bare name, e.g. sqrt(2)"
            )
        for kind, message in _UNSUPPORTED.items():
            if isinstance(node, kind):
                raise InvalidInput(message)
        raise InvalidInput(
            f"{type(node).__name__} is not supported; use numbers, + - * / // % ** and {_ALLOWED}"
        )

    def _chain(self, node: ast.BinOp, depth: int) -> Number:
        # Walk the left spine iteratively so a long sum like 1+2+...+200 is not "deep nesting".
        spine: list[ast.BinOp] = []
        current: ast.expr = node
        while isinstance(current, ast.BinOp):
            spine.append(current)
            current = current.left
        value = self.eval(current, depth + 1)
        for binop in reversed(spine):
            op = _BINOPS.get(type(binop.op))
            if op is None:
                hint = " (use ** for powers)" if isinstance(binop.op, ast.BitXor) else ""
                raise InvalidInput(
                    f"operator '{_op_text(binop.op)}' is not supported{hint}; use + - * / // % **"
                )
            right = self.eval(binop.right, depth + 1)
            value = _check_int(_binop(op, value, right), f"the result of '{op}'")
        return value

    def _call(self, node: ast.Call, depth: int) -> Number:
        if not isinstance(node.func, ast.Name):
            if isinstance(node.func, ast.Attribute):
                raise InvalidInput(
                    f"attribute access ('.{node.func.attr}') is not allowed; call functions by bare name, e.g. sqrt(2)"
                )
            raise InvalidInput(f"only these functions can be called: {', '.join(FUNCTIONS)}")
        name = node.func.id
        if name not in FUNCTIONS:
            raise InvalidInput(f"function '{name}' is not allowed; allowed are {_ALLOWED}")
        if node.keywords:
            raise InvalidInput(f"{name}() takes positional arguments only")
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            raise InvalidInput(f"{name}() does not accept *arguments")
        fn, lo, hi = FUNCTIONS[name]
        count = len(node.args)
        if count < lo or (hi is not None and count > hi):
            expected = f"{lo}" if lo == hi else f"{lo} or more" if hi is None else f"{lo} to {hi}"
            raise InvalidInput(f"{name}() takes {expected} argument(s), got {count}")
        args = [self.eval(arg, depth + 1) for arg in node.args]
        try:
            result = fn(*args)
        except ValueError as exc:
            if "math domain error" in str(exc):
                shown = ", ".join(_short(a) for a in args)
                raise InvalidInput(f"{name}({shown}) is undefined (math domain error)") from None
            raise
        return _check_int(result, f"the result of {name}()")


def _op_text(op: ast.AST) -> str:
    return {
        ast.BitXor: "^",
        ast.BitAnd: "&",
        ast.BitOr: "|",
        ast.LShift: "<<",
        ast.RShift: ">>",
        ast.MatMult: "@",
        ast.Invert: "~",
        ast.Not: "not",
    }.get(type(op), type(op).__name__)


def format_number(value: Number) -> str:
    """Ints exactly, floats by `repr` (shortest round-tripping form)."""
    return str(value) if isinstance(value, int) else repr(value)


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression; raises ValueError with a message meant for the model."""
    if not isinstance(expression, str):
        raise InvalidInput("expression must be a string")
    text = expression.strip()
    if not text:
        raise InvalidInput("expression is empty; pass an arithmetic expression such as (2 + 3) * 4")
    if len(text) > MAX_CHARS:
        raise InvalidInput(
            f"expression is {len(text)} characters; the limit is {MAX_CHARS}. Split it into smaller steps"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise InvalidInput(f"not a valid expression: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise InvalidInput("expression is nested too deeply; split it into smaller steps") from None
    except ValueError as exc:  # e.g. null bytes in the source
        raise InvalidInput(f"not a valid expression: {exc}") from None
    try:
        return _Evaluator().eval(tree)
    except ZeroDivisionError:
        raise InvalidInput("division by zero") from None
    except OverflowError:
        raise InvalidInput("numeric overflow: a result is too large for floating point") from None
    except RecursionError:
        raise InvalidInput("expression is nested too deeply; split it into smaller steps") from None
    except TypeError as exc:  # should not happen with the checks above; keep the contract anyway
        raise InvalidInput(f"invalid operands: {exc}") from None


_NUM = r"(\d[\d_]*(\.[\d_]*)?|\.\d[\d_]*)([eE][-+]?\d+)?"
_OPEN = rf"(\s*[-+]|\s*\(|\s*({'|'.join(FUNCTIONS)})\()*"
_OPERAND = rf"{_OPEN}\s*({_NUM}|{'|'.join(CONSTANTS)})(\s*\))*"
# The shape of an expression: operands (numbers or constants, after any signs, parentheses and
# function openings) joined by operators; parentheses are balanced by the evaluator. Declared so
# a grammar-constrained model cannot write "17*23," (the embedded model did).
EXPRESSION_PATTERN = rf"^{_OPERAND}(\s*(\*\*|//|[-+*/%,]){_OPERAND})*\s*$"


class _ExpressionValidator:
    """The signature's validation; when the pattern refuses, the evaluator's reason if it has one
    ("unknown name 'x'", "use ** for powers") tells the model more than the pattern does."""

    def __init__(self, inner: ArgsValidator) -> None:
        self.inner = inner

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.inner.validate(args)
        except ArgumentError:
            expression = args.get("expression")
            if isinstance(expression, str):
                try:
                    evaluate(expression)
                except ValueError as exc:
                    raise ArgumentError(f"'expression': {exc}") from None
            raise


@tool(effect="read_only")
def calculator(expression: Annotated[str, Field(pattern=EXPRESSION_PATTERN)]) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports numbers, + - * / // % ** (power), parentheses and sqrt, log (natural; log(x, base)),
    sin, cos, tan (radians), exp, abs, round, min, max, floor, ceil, factorial, pi, e.
    Integers are exact. Example: (2 + 3) * sqrt(16) / 7

    Args:
        expression: the expression to evaluate, e.g. "2**10 + factorial(5)"
    """
    return format_number(evaluate(expression))


calculator.validator = _ExpressionValidator(calculator.validator)

_TERM = rf"(?:[-+(]\s*)*(?:(?:{'|'.join(FUNCTIONS)})\([^()]*\)|\d+(?:\.\d+)?|pi)\)*"
# Arithmetic written in a request ("What is 17 * 23?" -> "17 * 23"): a grammar-constrained model
# is offered these as the expression (it otherwise stopped after the first number: "156").
EXPRESSION_IN_TEXT = rf"{_TERM}(?:\s*(?:\*\*|//|[-+*/%])\s*{_TERM})+|(?:{'|'.join(FUNCTIONS)})\([^()]*\)"
values_from(calculator, "expression", request_spans_source(EXPRESSION_IN_TEXT))


__all__ = ["calculator", "evaluate", "format_number"]
