"""The plan interpreter: a small subset of Python, parsed with `ast` and run by tether, never by
`eval` or `exec`, with every value's capabilities carried through every operation.

Supported: assignment (names, items `x[i] = v`, tuple unpacking, `+=` and friends), `if`/`elif`/`else`, `for` over a
list, dict, string or `range`, expressions (literals, f-strings, arithmetic, comparisons, `and`/`or`/
`not`, conditional expressions, indexing and slicing, `x.field` on a dict, list/dict/tuple literals,
list comprehensions), calls of tools (keyword arguments), of `extract(...)`, of a few builtins
(`len str int float bool round abs min max sum sorted list range enumerate zip`), of some str, list
and dict methods (those that change a list or dict as a statement of their own, on a name or an item
path: `x.append(v)`, `rows[0]["tags"].extend(t)`, `y = queue.pop()`), and `final_answer(value)`.
Anything else is refused when the plan is parsed.

Flows, exactly and conservatively:
- an operation's result carries the sources of every operand (a comparison or `in` reads the whole
  container, so it carries every part's);
- an index's sources join the element it picks; a comprehension's elements carry the sources of the
  list they come from and of its filter;
- control flow: inside an `if` or a `for`, everything stored and every tool call carries the sources
  of the condition (the iterable), and after it every name the statement may assign (in any branch,
  whichever ran) carries them too, so a value left untouched because a branch was not taken still
  says it depends on the condition;
- containers: a stored value is a copy, so no list or dict is reachable from two names (the heap is
  a tree under the names). Changing a container through a path (`box[0].append(v)`, `d["k"] = v`)
  labels the path's root name with the control flow and with what chose the container (the keys,
  the containers on the way); after an `if` or a `for`, every root a branch may change is labelled
  with the condition, taken or not. Every read goes through a root, so it carries the label;
- errors: a `ProgramError` carries the sources of the values its message was computed from, so the
  runner can withhold the text of one that depends on untrusted data (`ProgramError.for_planner`).
"""

from __future__ import annotations

import ast
import builtins
import operator
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from tether._errors import TetherError
from tether.plan._values import LITERAL, TRUSTED, Label, Value, deep_label, join_all, plain, tag

MAX_OPERATIONS = 100_000
MAX_ITEMS = 10_000  # range(), repeated strings and lists
MAX_CHARS = 1_000_000  # a string or list an operation makes
MAX_INT_BITS = 4096  # far below Python's 4,300-digit limit on int <-> str, so no conversion can raise
MAX_DEPTH = 64  # lists and dicts nested in each other

ToolCaller = Callable[[str, dict[str, Value], Label], Awaitable[Value]]
Extractor = Callable[[Value, Value, Value, Label], Awaitable[Value]]


class ProgramError(TetherError):
    """The plan cannot be run (a construct tether does not interpret, a name never assigned, a
    tool's refusal): the message says what and where. `label` holds the sources of the values the
    message was computed from (quoted, measured or typed); `kind` names the error without them."""

    def __init__(self, message: str, line: int | None = None, *, kind: str = "ProgramError",
                 label: Label = TRUSTED) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.message, self.line, self.kind, self.label = message, line, kind, label

    def at(self, line: int | None) -> ProgramError:
        """This error at `line` (one raised by a tool call or the reader has none of its own)."""
        if self.line is None and line is not None:
            self.line, self.args = line, (f"line {line}: {self.message}",)
        return self

    def for_planner(self, seen: frozenset[str]) -> str:
        """What the planner is told: the whole message when every source it was computed from is in
        `seen` (what the planner may read) and none is private, else only the error's kind and line."""
        if self.label.sources <= seen and self.label.readers is None:
            return str(self)
        where = f"line {self.line}: " if self.line else ""
        why = ", ".join(sorted(self.label.sources - seen)) or "private data"
        return f"{where}{self.kind} (the message depends on {why} and is withheld)"


class LimitError(ProgramError):
    """A value or a computation over the plan's bounds."""

    def __init__(self, message: str, line: int | None = None, *, label: Label = TRUSTED) -> None:
        super().__init__(message, line, kind="LimitError", label=label)


def bounded(obj: object, line: int | None = None, label: Label = TRUSTED) -> None:
    """Refuses a plain value (or Value) nested deeper than MAX_DEPTH or holding an int over
    MAX_INT_BITS, walked without recursion, so converting it later cannot fail."""
    stack: list[tuple[object, int]] = [(obj, 0)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, Value):
            x = x.v
        if isinstance(x, bool):
            continue
        if isinstance(x, int) and x.bit_length() > MAX_INT_BITS:
            raise LimitError(f"a number over {MAX_INT_BITS} bits", line, label=label)
        if isinstance(x, (list, tuple, dict)):
            if depth >= MAX_DEPTH:
                raise LimitError(f"lists or dicts nested more than {MAX_DEPTH} deep", line, label=label)
            stack.extend((y, depth + 1) for y in (x.values() if isinstance(x, dict) else x))


_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
        ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not}
# fill/align, sign, #, 0, a width and precision of at most 3 digits, grouping, type: no 10**9-wide fields
_FORMAT_SPEC = re.compile(r"(?:.?[<>^=])?[+\- ]?#?0?\d{0,3}[,_]?(?:\.\d{1,3})?[bcdeEfFgGnosxX%]?")
_STMTS = (ast.Assign, ast.AugAssign, ast.Expr, ast.If, ast.For, ast.Pass)
_EXPRS = (ast.Constant, ast.Name, ast.JoinedStr, ast.FormattedValue, ast.BinOp, ast.UnaryOp, ast.BoolOp,
          ast.Compare, ast.IfExp, ast.Subscript, ast.Slice, ast.Attribute, ast.List, ast.Tuple, ast.Dict,
          ast.ListComp, ast.comprehension, ast.Call, ast.keyword, ast.Load, ast.Store, ast.operator,
          ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context)
_STR_METHODS = {"lower", "upper", "strip", "lstrip", "rstrip", "split", "join", "replace", "startswith",
                "endswith", "title", "capitalize", "count", "find", "splitlines"}
_LIST_METHODS = {"index", "count"}
_DICT_METHODS = {"get", "keys", "values", "items"}
# methods that change their list or dict: only as a statement (or an assignment's value) of their own,
# on a name or an item path, so the flow analysis sees every change where it happens
MUTATORS = {"append", "extend", "insert", "pop", "remove", "update", "setdefault"}
_PRINTF_WIDE = re.compile(r"%[-+ #0]*(?:\*|\d{4,})|%[-+ #0]*\d*\.(?:\*|\d{4,})")
_BUILTINS = {"len", "str", "int", "float", "bool", "round", "abs", "min", "max", "sum", "sorted", "list",
             "range", "enumerate", "zip"}


def parse(program: str) -> ast.Module:
    """The plan's syntax tree, once every node in it is one tether interprets."""
    try:
        tree = ast.parse(program, mode="exec")
    except SyntaxError as exc:
        raise ProgramError(f"not valid Python: {exc.msg}", exc.lineno) from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, *_STMTS, *_EXPRS)):
            continue
        raise ProgramError(f"{type(node).__name__} is not supported in a plan (no def, while, import, "
                        "lambda, try, with, break or attribute access beyond a dict's fields)",
                        getattr(node, "lineno", None))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            raise ProgramError("assigning to an attribute is not supported", node.lineno)
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load) and \
                (root(node) is None or isinstance(node.ctx, ast.Del)):
            raise ProgramError("an item can be assigned only through a name (x[i] = v, d['k'][0] = v)", node.lineno)
        if isinstance(node, ast.Name) and node.id.startswith("_"):
            raise ProgramError(f"names starting with '_' are not allowed ({node.id})", node.lineno)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            raise ProgramError(f"attributes starting with '_' are not allowed ({node.attr})", node.lineno)
    on_its_own: set[int] = set()  # calls that are a statement, or an assignment's value
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expr, ast.Assign)) and isinstance(node.value, ast.Call):
            on_its_own.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            if root(node.func.value) is None:
                raise ProgramError(f".{node.func.attr}() changes a list or dict: call it on a name or an item of "
                                   f"one (x.{node.func.attr}(...), x[0].{node.func.attr}(...))", node.lineno)
            if id(node) not in on_its_own:
                raise ProgramError(f".{node.func.attr}() changes a list or dict: call it as a statement of its own "
                                   f"(or `y = x.{node.func.attr}(...)`), not inside an expression", node.lineno)
    return tree


def root(node: ast.expr) -> str | None:
    """The name a path (`x`, `x[i]`, `x.field`, `x[i]["k"]`) starts from; None for anything else."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            return None
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def assigned(nodes: list[ast.stmt]) -> set[str]:
    """Every name the statements may assign or change (in any branch): names stored, and the root
    of every path an item is stored through or a changing method is called on."""
    out: set[str] = set()
    for stmt in nodes:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                out.add(root(node) or "")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATORS):
                out.add(root(node.func.value) or "")
    out.discard("")
    return out


def fresh(value: Value) -> Value:
    """A copy of every list and dict in `value` (scalars are shared: nothing changes them), so a
    stored value shares no container with another."""
    v = value.v
    if isinstance(v, list):
        return Value([fresh(x) for x in v], value.label)
    if isinstance(v, dict):
        return Value({k: fresh(x) for k, x in v.items()}, value.label)
    return value


@dataclass
class Interpreter:
    """Runs one plan. `call_tool(name, args, pc)` runs a tool (checks, approval, the executor) and
    returns its result as a Value; `extract(instruction, text, fields, pc)` is the quarantined reader."""

    tools: set[str]
    call_tool: ToolCaller
    extract: Extractor | None = None
    env: dict[str, Value] = field(default_factory=dict)
    answer: Value | None = None
    operations: int = 0
    max_operations: int = MAX_OPERATIONS
    literal: Label = LITERAL  # what the plan's own literals carry: the user's, unless the request was not

    async def run(self, program: str | ast.Module) -> Value | None:
        tree = parse(program) if isinstance(program, str) else program
        known = self.tools | _BUILTINS | {"extract", "final_answer"}
        for node in ast.walk(tree):  # before anything runs: a plan fails whole, not after an effect
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in known:
                raise ProgramError(f"no tool or function named '{node.func.id}' (tools: {', '.join(sorted(self.tools))})",
                                node.lineno)
        for name, value in self.env.items():
            bounded(value, label=deep_label(value))
            self.env[name] = fresh(value)
        try:
            await self.block(tree.body, TRUSTED)
        except RecursionError:  # a value or an expression nested past what Python's stack holds
            raise LimitError("the plan nests values or expressions too deeply") from None
        return self.answer

    # -- statements ----------------------------------------------------------------------------

    async def block(self, body: list[ast.stmt], pc: Label) -> None:
        for stmt in body:
            await self.stmt(stmt, pc)

    async def stmt(self, node: ast.stmt, pc: Label) -> None:
        self._tick(node)
        match node:
            case ast.Assign(targets=targets, value=value):
                got = await self.expr(value, pc)
                for target in targets:
                    await self._assign(target, got, pc)
            case ast.AugAssign(target=ast.Name(id=name) as target, op=op, value=value):
                got = self._binop(op, self._load(name, node), await self.expr(value, pc), node)
                self._store(target, got, pc)
            case ast.AugAssign(target=ast.Subscript() as target, op=op, value=value):
                name, box, chose = await self._container(target.value, pc)
                key = await self.expr(target.slice, pc)  # each evaluated once, as in Python
                old = self._pick(box, key, chose, node.lineno).with_label(box.label | key.label)
                self._put(name, box, chose, key, self._binop(op, old, await self.expr(value, pc), node), pc,
                          node.lineno)
            case ast.AugAssign():
                raise ProgramError("only a name or an item can be updated with +=", node.lineno)
            case ast.Expr(value=value):
                await self.expr(value, pc)
            case ast.If(test=test, body=body, orelse=orelse):
                cond = await self.expr(test, pc)
                inner = pc | deep_label(cond)
                await self.block(body if plain(cond) else orelse, inner)
                self._depend(assigned(body) | assigned(orelse), deep_label(cond))
            case ast.For(target=target, iter=it, body=body, orelse=orelse):
                if orelse:
                    raise ProgramError("for ... else is not supported", node.lineno)
                seq = await self.expr(it, pc)
                over = deep_label(seq) if not isinstance(seq.v, list) else seq.label
                inner = pc | over
                for item in self._items(seq, node):
                    await self._assign(target, item, inner)
                    await self.block(body, inner)
                # how many times the body ran depends on the iterable: so does all it assigned
                self._depend(assigned(body) | {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}, over)
            case ast.Pass():
                pass
            case _:
                raise ProgramError(f"{type(node).__name__} is not supported", node.lineno)

    def _depend(self, names: set[str], label: Label) -> None:
        for name in names:
            if name in self.env:
                self.env[name] = self.env[name].with_label(label)

    async def _assign(self, target: ast.expr, value: Value, pc: Label) -> None:
        if isinstance(target, ast.Subscript):
            await self._store_item(target, value, pc)
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = self._items(value, target)
            if len(items) != len(target.elts):
                raise ProgramError(f"cannot unpack {len(items)} values into {len(target.elts)} names", target.lineno,
                                   kind="ValueError", label=value.label)
            for t, item in zip(target.elts, items, strict=True):
                await self._assign(t, item.with_label(value.label), pc)
        else:
            self._store(target, value, pc)

    def _store(self, target: ast.expr, value: Value, pc: Label) -> None:
        match target:
            case ast.Name(id=name):
                if name in self.tools or name in _BUILTINS or name in ("extract", "final_answer"):
                    raise ProgramError(f"'{name}' is a tool or a builtin; choose another name", target.lineno)
                # copied: no list or dict is reachable from two names, so a change through one path
                # cannot reach a value whose flow it does not label
                self.env[name] = fresh(value).with_label(pc)
            case ast.Tuple(elts=elts) | ast.List(elts=elts):
                items = self._items(value, target)
                if len(items) != len(elts):
                    raise ProgramError(f"cannot unpack {len(items)} values into {len(elts)} names", target.lineno,
                                       kind="ValueError", label=value.label)
                for t, item in zip(elts, items, strict=True):
                    self._store(t, item.with_label(value.label), pc)
            case _:
                raise ProgramError("only names can be assigned here", target.lineno)

    async def _container(self, path: ast.expr, pc: Label) -> tuple[str, Value, Label]:
        """The list or dict a path names, to be changed: its root name, the container's own Value
        (not a copy) and what chose it: the control flow, the keys, and the containers on the way."""
        steps: list[ast.expr] = []
        node = path
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            steps.append(node)
            node = node.value
        if not isinstance(node, ast.Name):
            raise ProgramError("only a name or an item of one can be changed", getattr(path, "lineno", None))
        name, line = node.id, getattr(path, "lineno", None)
        cur, chose = self._load(name, node), pc
        for step in reversed(steps):
            key = Value(step.attr, self.literal) if isinstance(step, ast.Attribute) else \
                await self.expr(step.slice, pc)  # type: ignore[attr-defined]
            chose = chose | cur.label | key.label
            cur = self._pick(cur, key, chose, line)
        return name, cur, chose

    def _pick(self, seq: Value, key: Value, label: Label, line: int | None) -> Value:
        """The item of `seq` at `key` itself (a container to change in place)."""
        if isinstance(seq.v, dict) and isinstance(key.v, str):
            if key.v not in seq.v:
                raise ProgramError(f"no field {key.v!r}", line, kind="KeyError", label=label | key.label)
            return cast(Value, seq.v[key.v])
        if isinstance(seq.v, list) and isinstance(key.v, int) and not isinstance(key.v, bool):
            if not -len(seq.v) <= key.v < len(seq.v):
                raise ProgramError(f"index {key.v} is out of range (length {len(seq.v)})", line, kind="IndexError",
                                   label=label | key.label)
            return cast(Value, seq.v[key.v])
        raise ProgramError(f"cannot change an item of a {type(seq.v).__name__} at a {type(key.v).__name__}", line,
                           kind="TypeError", label=label | key.label)

    def _label(self, name: str, label: Label) -> None:
        """A change reached `name`'s containers under `label`: every read through it carries them."""
        self.env[name] = self.env[name].with_label(label)

    async def _store_item(self, target: ast.Subscript, value: Value, pc: Label) -> None:
        name, box, chose = await self._container(target.value, pc)
        self._put(name, box, chose, await self.expr(target.slice, pc), value, pc, target.lineno)

    def _put(self, name: str, box: Value, chose: Label, key: Value, value: Value, pc: Label, line: int) -> None:
        """`box[key] = value`, `box` being reached from `name` (labelled with what chose the slot)."""
        chose = chose | box.label | key.label
        item = fresh(value).with_label(pc)
        if isinstance(box.v, dict):
            if not isinstance(key.v, str):
                raise ProgramError("dict keys must be strings", line, kind="TypeError", label=key.label)
            if key.v not in box.v and len(box.v) >= MAX_ITEMS:
                raise LimitError(f"a dict over {MAX_ITEMS} items", line, label=chose)
            box.v[key.v] = item
        else:
            self._pick(box, key, chose, line)  # the index must exist
            box.v[key.v] = item
        self._label(name, chose)

    def _items(self, seq: Value, node: ast.AST | int | None) -> list[Value]:
        """The elements a loop or an unpacking walks, each carrying the sequence's own sources."""
        v = seq.v
        line = node if isinstance(node, int) or node is None else getattr(node, "lineno", None)
        if isinstance(v, (list, dict, str)) and len(v) > self.max_operations:
            raise LimitError(f"iterating over {len(v)} items is more than the plan's {self.max_operations} operations",
                             line, label=seq.label)
        if isinstance(v, list):
            return [x.with_label(seq.label) for x in v]
        if isinstance(v, dict):
            return [Value(k, seq.label) for k in v]
        if isinstance(v, str):
            return [Value(ch, seq.label) for ch in v]
        raise ProgramError(f"cannot iterate over a {type(v).__name__}", line, kind="TypeError", label=seq.label)

    def _load(self, name: str, node: ast.AST) -> Value:
        if name not in self.env:
            raise ProgramError(f"name '{name}' is not assigned before it is used", getattr(node, "lineno", None),
                               kind="NameError")
        return self.env[name]

    def _tick(self, node: ast.AST) -> None:
        self.operations += 1
        if self.operations > self.max_operations:
            raise LimitError(f"the plan ran more than {self.max_operations} operations", getattr(node, "lineno", None))

    # -- expressions ---------------------------------------------------------------------------

    async def expr(self, node: ast.expr, pc: Label) -> Value:
        self._tick(node)
        match node:
            case ast.Constant(value=value):
                if not (value is None or isinstance(value, (str, int, float, bool))):
                    raise ProgramError(f"a {type(value).__name__} literal is not supported", node.lineno)
                return Value(value, self.literal)
            case ast.Name(id=name):
                return self._load(name, node)
            case ast.JoinedStr(values=values):
                pieces = [await self.expr(v, pc) for v in values]
                label = join_all(g.label for g in pieces)
                if sum(len(str(g.v)) for g in pieces) > MAX_CHARS:
                    raise LimitError(f"an f-string over {MAX_CHARS} characters", node.lineno, label=label)
                return Value("".join(str(g.v) for g in pieces), label)
            case ast.FormattedValue(value=value, format_spec=spec):
                got = await self.expr(value, pc)
                fmt = await self.expr(spec, pc) if spec is not None else Value("", TRUSTED)
                if not _FORMAT_SPEC.fullmatch(str(fmt.v)):
                    raise ProgramError(f"format spec {str(fmt.v)[:40]!r} is not supported (width and precision "
                                       "up to 3 digits)", node.lineno, kind="ValueError", label=fmt.label)
                try:
                    text = format(plain(got), str(fmt.v))
                except (ValueError, TypeError) as exc:
                    raise ProgramError(f"cannot format: {exc}", node.lineno, kind=type(exc).__name__,
                                       label=deep_label(got) | fmt.label) from None
                return Value(text, deep_label(got) | fmt.label)
            case ast.BinOp(left=left, op=op, right=right):
                return self._binop(op, await self.expr(left, pc), await self.expr(right, pc), node)
            case ast.UnaryOp(op=op, operand=operand):
                got = await self.expr(operand, pc)
                if isinstance(op, ast.Not):
                    return Value(not plain(got), deep_label(got))
                if not isinstance(got.v, (int, float)) or isinstance(got.v, bool):
                    raise ProgramError("unary - and + take a number", node.lineno, kind="TypeError", label=got.label)
                return Value(-got.v if isinstance(op, ast.USub) else +got.v, got.label)
            case ast.BoolOp(op=op, values=values):
                seen = TRUSTED
                result: Value | None = None
                for v in values:  # an operand runs only when those before it let it: under their sources
                    result = await self.expr(v, pc | seen)
                    seen = seen | deep_label(result)
                    if bool(plain(result)) is isinstance(op, ast.Or):
                        break  # which operand is the result depends on all those evaluated
                assert result is not None
                return result.with_label(seen)
            case ast.Compare(left=left, ops=ops, comparators=comparators):
                a = await self.expr(left, pc)
                label, ok = deep_label(a), True
                for cmp, right in zip(ops, comparators, strict=True):
                    b = await self.expr(right, pc)
                    label = label | deep_label(b)
                    try:
                        ok = bool(_CMP[type(cmp)](plain(a), plain(b)))
                    except TypeError as exc:
                        raise ProgramError(f"cannot compare: {exc}", node.lineno, kind="TypeError", label=label) from None
                    if not ok:
                        break
                    a = b
                return Value(ok, label)
            case ast.IfExp(test=test, body=body, orelse=orelse):
                cond = await self.expr(test, pc)
                chosen = await self.expr(body if plain(cond) else orelse, pc | deep_label(cond))
                return chosen.with_label(deep_label(cond))
            case ast.Subscript(value=value, slice=index):
                return await self._subscript(await self.expr(value, pc), index, pc, node)
            case ast.Attribute(value=value, attr=attr):
                got = await self.expr(value, pc)
                if not isinstance(got.v, dict):
                    raise ProgramError(f".{attr} reads a field of a dict; this is a {type(got.v).__name__}", node.lineno,
                                       kind="TypeError", label=got.label)
                return self._field(got, Value(attr, self.literal), node)
            case ast.List(elts=elts) | ast.Tuple(elts=elts):
                return Value([await self.expr(e, pc) for e in elts], self.literal)
            case ast.Dict(keys=keys, values=values):
                out: dict[str, Value] = {}
                label = self.literal
                for k, v in zip(keys, values, strict=True):
                    if k is None:
                        raise ProgramError("**unpacking in a dict is not supported", node.lineno)
                    key = await self.expr(k, pc)
                    if not isinstance(key.v, str):
                        raise ProgramError("dict keys must be strings", node.lineno, kind="TypeError", label=key.label)
                    out[key.v] = await self.expr(v, pc)
                    label = label | key.label  # which key holds a value depends on the key
                return Value(out, label)
            case ast.ListComp(elt=elt, generators=generators):
                return await self._comprehension(elt, generators, pc, node)
            case ast.Call():
                return await self._call(node, pc)
        raise ProgramError(f"{type(node).__name__} is not supported", getattr(node, "lineno", None))

    def _binop(self, op: ast.operator, a: Value, b: Value, node: ast.AST) -> Value:
        fn = _BIN.get(type(op))
        line = getattr(node, "lineno", None)
        if fn is None:
            raise ProgramError(f"the operator {type(op).__name__} is not supported", line)
        label = a.label | b.label
        if isinstance(a.v, list) and isinstance(b.v, list) and isinstance(op, ast.Add):
            if len(a.v) + len(b.v) > MAX_ITEMS:
                raise LimitError(f"a list over {MAX_ITEMS} items", line, label=label)
            return Value(a.v + b.v, label)  # the elements keep their own sources
        if isinstance(a.v, (list, dict)) or isinstance(b.v, (list, dict)):
            raise ProgramError(f"{type(op).__name__} does not take a list or dict here", line, kind="TypeError",
                               label=label)
        if isinstance(op, ast.Mult) and (isinstance(a.v, str) or isinstance(b.v, str)):
            text, n = (a.v, b.v) if isinstance(a.v, str) else (b.v, a.v)
            if not isinstance(n, int) or n * len(text) > MAX_CHARS:
                raise LimitError(f"string repetition over {MAX_CHARS} characters", line, label=label)
        if isinstance(op, ast.Mod) and isinstance(a.v, str) and _PRINTF_WIDE.search(a.v):
            raise LimitError("a %-format width or precision over 3 digits", line, label=label)
        if isinstance(op, ast.Pow) and isinstance(b.v, (int, float)) and abs(b.v) > 64:
            raise LimitError("exponent too large", line, label=label)
        try:
            out = fn(a.v, b.v)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
            raise ProgramError(f"{type(exc).__name__}: {exc}", line, kind=type(exc).__name__, label=label) from None
        if isinstance(out, str) and len(out) > MAX_CHARS:
            raise LimitError(f"a string over {MAX_CHARS} characters", line, label=label)
        if isinstance(out, int) and out.bit_length() > MAX_INT_BITS:  # bounds the next operation's cost
            raise LimitError(f"a number over {MAX_INT_BITS} bits", line, label=label)
        return Value(out, label)

    async def _subscript(self, seq: Value, index: ast.expr, pc: Label, node: ast.AST) -> Value:
        line = getattr(node, "lineno", None)
        if isinstance(index, ast.Slice):
            bounds = [await self.expr(b, pc) if b is not None else Value(None, TRUSTED)
                      for b in (index.lower, index.upper, index.step)]
            label = seq.label | join_all(b.label for b in bounds)
            try:
                cut = slice(*(b.v for b in bounds))
                if isinstance(seq.v, list):
                    return Value([x.with_label(label) for x in seq.v[cut]], label)
                if isinstance(seq.v, str):
                    return Value(seq.v[cut], label)
            except (TypeError, ValueError) as exc:
                raise ProgramError(f"bad slice: {exc}", line, kind=type(exc).__name__, label=label) from None
            raise ProgramError(f"cannot slice a {type(seq.v).__name__}", line, kind="TypeError", label=label)
        key = await self.expr(index, pc)
        if isinstance(seq.v, dict):
            return self._field(seq, key, node)
        if isinstance(seq.v, (list, str)) and isinstance(key.v, int) and not isinstance(key.v, bool):
            try:
                item = seq.v[key.v]
            except IndexError:
                raise ProgramError(f"index {key.v} is out of range (length {len(seq.v)})", line, kind="IndexError",
                                   label=seq.label | key.label) from None
            got = item if isinstance(item, Value) else Value(item, TRUSTED)
            return got.with_label(seq.label | key.label)
        raise ProgramError(f"cannot index a {type(seq.v).__name__} with a {type(key.v).__name__}", line,
                           kind="TypeError", label=seq.label | key.label)

    def _field(self, record: Value, key: Value, node: ast.AST) -> Value:
        if not isinstance(key.v, str) or key.v not in record.v:
            fields = ", ".join(sorted(record.v)[:20])  # the field names are the record's: its sources
            raise ProgramError(f"no field {str(key.v)[:100]!r} (fields: {fields})", getattr(node, "lineno", None),
                               kind="KeyError", label=record.label | key.label)
        return cast(Value, record.v[key.v]).with_label(record.label | key.label)

    async def _comprehension(self, elt: ast.expr, generators: list[ast.comprehension], pc: Label,
                             node: ast.AST) -> Value:
        saved = dict(self.env)
        out: list[Value] = []
        shape = TRUSTED  # which elements made it in depends on the lists and the filters

        async def walk(i: int, inner: Label) -> None:
            nonlocal shape
            if i == len(generators):
                out.append((await self.expr(elt, inner)).with_label(inner))
                return
            gen = generators[i]
            if gen.is_async:
                raise ProgramError("async comprehensions are not supported", getattr(node, "lineno", None))
            seq = await self.expr(gen.iter, inner)
            over = seq.label if isinstance(seq.v, list) else deep_label(seq)
            shape = shape | over
            for item in self._items(seq, node):
                self._store(gen.target, item, inner | over)
                keep, conds = True, inner | over
                for test in gen.ifs:
                    cond = await self.expr(test, conds)
                    conds = conds | deep_label(cond)
                    shape = shape | deep_label(cond)
                    if not plain(cond):
                        keep = False
                        break
                if keep:
                    await walk(i + 1, conds)

        try:
            await walk(0, pc)
        finally:
            self.env = saved  # comprehension names do not leak, as in Python
        return Value(out, self.literal | shape)

    async def _call(self, node: ast.Call, pc: Label) -> Value:
        line = node.lineno
        func = node.func
        if isinstance(func, ast.Attribute):
            name, chose = "", TRUSTED
            if func.attr in MUTATORS:
                name, receiver, chose = await self._container(func.value, pc)
            else:
                receiver = await self.expr(func.value, pc)
            args = [await self.expr(a, pc) for a in node.args]
            if node.keywords:
                raise ProgramError(f".{func.attr}() takes no keyword arguments here", line)
            if func.attr in MUTATORS and isinstance(receiver.v, (list, dict)):
                got = self._change(receiver, func.attr, args, pc, line)
                # what changed depends on the container's shape, and on the arguments' (how many items
                # extend adds, at which index insert puts one); which item remove takes, on every item
                shape = deep_label(receiver) | deep_label(args[0]) if func.attr == "remove" else \
                    join_all(a.label for a in args[:1]) if func.attr != "append" else TRUSTED
                self._label(name, chose | receiver.label | shape)
                return got
            return self._method(receiver, func.attr, args, pc, func, node)
        if not isinstance(func, ast.Name):
            raise ProgramError("only tools, extract, final_answer, builtins and methods can be called", line)
        name = func.id
        if name in self.tools:
            if node.args:
                raise ProgramError(f"call tools with keyword arguments: {name}(argument=value, ...)", line)
            kwargs: dict[str, Value] = {}
            for kw in node.keywords:
                if kw.arg is None:
                    raise ProgramError("**arguments are not supported", line)
                kwargs[kw.arg] = await self.expr(kw.value, pc)
                bounded(kwargs[kw.arg], line)
            try:
                return await self.call_tool(name, kwargs, pc)
            except ProgramError as exc:
                raise exc.at(line) from None
        if any(k.arg is None for k in node.keywords):
            raise ProgramError("**arguments are not supported", line)
        args = [await self.expr(a, pc) for a in node.args]
        named = {str(k.arg): await self.expr(k.value, pc) for k in node.keywords}
        if name == "final_answer":
            if len(args) != 1 or named:
                raise ProgramError("final_answer takes one value", line)
            bounded(args[0], line)
            self.answer = fresh(args[0]).with_label(pc)  # a copy: a later change to the list is not the answer
            return Value(None, pc)
        if name == "extract":
            if self.extract is None:
                raise ProgramError("this plan has no quarantined reader (extract)", line)
            if len(args) != 3 or named:
                raise ProgramError("extract(instruction, text, fields) takes three values", line)
            try:
                got = await self.extract(args[0], args[1], args[2], pc)
            except ProgramError as exc:
                raise exc.at(line) from None
            bounded(got, line, deep_label(got))
            return got
        if name in _BUILTINS:
            return self._builtin(name, args, named, line)
        raise ProgramError(f"no tool or function named '{name}' (tools: {', '.join(sorted(self.tools))})", line)

    def _builtin(self, name: str, args: list[Value], kw: dict[str, Value], line: int) -> Value:
        label = join_all(deep_label(a) for a in [*args, *kw.values()])
        raw = [plain(a) for a in args]
        raw_kw = {k: plain(v) for k, v in kw.items()}
        if name == "range" and any(isinstance(x, int) and abs(x) > MAX_ITEMS for x in raw):
            raise LimitError(f"range() is limited to {MAX_ITEMS} items", line, label=label)
        if name in ("enumerate", "zip", "sorted", "list") and any(
                isinstance(x, (list, dict, str)) and len(x) > MAX_ITEMS for x in raw):
            raise LimitError(f"{name}() would make more than {MAX_ITEMS} items", line, label=label)
        if name not in ("sorted", "min", "max") and raw_kw:
            raise ProgramError(f"{name}() takes no keyword arguments here", line)
        if name in ("sorted", "min", "max") and set(raw_kw) - {"reverse", "default"}:
            raise ProgramError(f"{name}() takes no key= here", line)
        try:
            out = getattr(builtins, name)(*raw, **raw_kw)
        except (TypeError, ValueError, OverflowError) as exc:
            # the message may quote an argument (int() of a whole string): it carries their sources
            raise ProgramError(f"{name}(): {exc}", line, kind=type(exc).__name__, label=label) from None
        if name in ("range", "enumerate", "zip", "sorted", "list"):
            out = [list(x) if isinstance(x, tuple) else x for x in out]
            if len(out) > MAX_ITEMS:
                raise LimitError(f"{name}() made more than {MAX_ITEMS} items", line, label=label)
        bounded(out, line, label)  # int("9" * 4000), sum() of large numbers
        return tag(out, label)  # every part depends on every argument

    def _method(self, receiver: Value, method: str, args: list[Value], pc: Label, func: ast.Attribute,
                node: ast.AST) -> Value:
        line = getattr(node, "lineno", None)
        v = receiver.v
        allowed = _STR_METHODS if isinstance(v, str) else _LIST_METHODS if isinstance(v, list) \
            else _DICT_METHODS if isinstance(v, dict) else set()
        if method not in allowed:
            raise ProgramError(f"{type(v).__name__}.{method}() is not supported", line, kind="AttributeError",
                               label=receiver.label)
        label = join_all(deep_label(a) for a in args)
        if isinstance(v, dict):
            if method == "get":
                if not args or not isinstance(args[0].v, str):
                    raise ProgramError(".get() takes a string key", line)
                if args[0].v in v:
                    return cast(Value, v[args[0].v]).with_label(receiver.label | args[0].label)
                return (args[1] if len(args) > 1 else Value(None, TRUSTED)).with_label(receiver.label | label)
            if method == "keys":
                return Value([Value(k, receiver.label) for k in v], receiver.label)
            if method == "values":
                return Value([x.with_label(receiver.label) for x in v.values()], receiver.label)
            return Value([Value([Value(k, receiver.label), x.with_label(receiver.label)], receiver.label)
                          for k, x in v.items()], receiver.label)
        label = label | deep_label(receiver)
        raw = [plain(a) for a in args]
        if method in ("join", "replace"):  # sized before they run: their result can dwarf their inputs
            pieces = raw[0] if method == "join" and raw and isinstance(raw[0], list) else []
            size = sum(len(str(p)) for p in pieces) + len(str(v)) * len(pieces) if method == "join" else \
                len(str(v)) * (1 + max((len(str(x)) for x in raw[1:2]), default=0))
            if size > MAX_CHARS:
                raise LimitError(f".{method}() would make a string over {MAX_CHARS} characters", line, label=label)
        try:
            out = getattr(plain(receiver), method)(*raw)
        except (TypeError, ValueError, AttributeError) as exc:
            # the message may quote the receiver or an argument (list.index): it carries their sources
            raise ProgramError(f".{method}(): {exc}", line, kind=type(exc).__name__, label=label) from None
        if isinstance(out, list) and len(out) > MAX_ITEMS:
            raise LimitError(f".{method}() made more than {MAX_ITEMS} items", line, label=label)
        return tag(out, label)

    def _change(self, box: Value, method: str, args: list[Value], pc: Label, line: int | None) -> Value:
        """A list or dict changed in place: what goes in is a copy under the control flow."""
        v, label = box.v, box.label | join_all(a.label for a in args)
        kinds = {"append": 1, "extend": 1, "insert": 2, "remove": 1, "update": 1}
        if (method in kinds and len(args) != kinds[method]) or (method in ("pop", "setdefault") and len(args) > 2):
            raise ProgramError(f".{method}() does not take {len(args)} values", line, kind="TypeError")
        if isinstance(v, list):
            if method in ("update", "setdefault"):
                raise ProgramError(f"list.{method}() is not supported", line, kind="AttributeError")
            add = len(args[0].v) if method == "extend" and isinstance(args[0].v, (list, str, dict)) else \
                1 if method in ("append", "insert") else 0
            if len(v) + add > MAX_ITEMS:
                raise LimitError(f"a list over {MAX_ITEMS} items", line, label=label)
            if method == "append":
                v.append(fresh(args[0]).with_label(pc))
            elif method == "extend":
                v.extend(fresh(x).with_label(pc) for x in self._items(args[0], line))
            elif method == "insert":
                if not isinstance(args[0].v, int) or isinstance(args[0].v, bool):
                    raise ProgramError(".insert() takes an index first", line, kind="TypeError", label=args[0].label)
                v.insert(args[0].v, fresh(args[1]).with_label(pc))
            elif method == "remove":
                at = [plain(x) for x in v].index(plain(args[0])) if plain(args[0]) in [plain(x) for x in v] else -1
                if at < 0:
                    raise ProgramError(".remove(): the value is not in the list", line, kind="ValueError", label=label)
                del v[at]
            else:  # pop
                at = args[0].v if args else -1
                if not isinstance(at, int) or isinstance(at, bool) or not -len(v) <= at < len(v):
                    raise ProgramError(f".pop(): no index {str(at)[:40]} (length {len(v)})", line, kind="IndexError",
                                       label=label)
                return cast(Value, v.pop(at)).with_label(box.label | (args[0].label if args else TRUSTED) | pc)
            return Value(None, pc)
        if method not in ("update", "pop", "setdefault"):
            raise ProgramError(f"dict.{method}() is not supported", line, kind="AttributeError")
        if method == "update":
            if not isinstance(args[0].v, dict):
                raise ProgramError(".update() takes a dict", line, kind="TypeError", label=args[0].label)
            if len(v.keys() | args[0].v.keys()) > MAX_ITEMS:
                raise LimitError(f"a dict over {MAX_ITEMS} items", line, label=label)
            for k, x in args[0].v.items():  # which keys it sets depends on the other dict's shape
                v[k] = fresh(x).with_label(pc | args[0].label)
            return Value(None, pc)
        key = args[0] if args else Value(None, TRUSTED)
        if not isinstance(key.v, str):
            raise ProgramError(f".{method}() takes a string key", line, kind="TypeError", label=key.label)
        if key.v in v:
            got: Value = v.pop(key.v) if method == "pop" else v[key.v]
            return got.with_label(box.label | key.label | pc)
        if len(args) < 2 and method == "pop":
            raise ProgramError(f".pop(): no field {key.v[:100]!r}", line, kind="KeyError", label=box.label | key.label)
        default = args[1] if len(args) > 1 else Value(None, TRUSTED)
        if method == "setdefault":
            if len(v) >= MAX_ITEMS:
                raise LimitError(f"a dict over {MAX_ITEMS} items", line, label=label)
            v[key.v] = fresh(default).with_label(pc)
        return default.with_label(box.label | key.label | pc)
