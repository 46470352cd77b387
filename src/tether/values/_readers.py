"""Confidentiality by declaration: who may read a tool's output, who reads what a call sends, and
whether a call would let a value reach someone outside its readers. One rule for both modes: the
loop calls it with the join of the hidden values substituted into a call, plan mode with the labels
of the call's arguments and control flow.

Declared with the tool (`tether.tools.Declares`):
- `output_readers`: `"public"`, `"user"`, `"secret"`, or the fields of the output naming its readers
  besides the user (`("sender", "recipients", "cc", "bcc")`). Undeclared: `secret_output` is secret,
  `private_output` the user's, anything else public.
- `sends_to`: `"user"`, `"public"`, or the arguments naming who receives the call's data. Undeclared:
  a tool with `url_args` sends to the public, one with `writes_path` to the user, a declared read
  sends nothing, any other effect goes where its arguments say (`WHERE_ARGS_SAY`).
- `on_leak`: `"approve"` asks a person, `"refuse"` refuses.

Reader names are e-mail addresses (or channel names, user names) as the tools give them, compared
lowercased; `"Name <a@b.org>"` is read as `a@b.org`. They come from data other people wrote, so no
message the deciding model or the planner reads names them: a reason says how many there are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

from tether.values._labels import TRUSTED, USER, Label, join_all

if TYPE_CHECKING:
    from tether.tools._base import Tool
    from tether.tools._declares import Declares

PUBLIC: Literal["public"] = "public"
WHERE_ARGS_SAY: Literal["args"] = "args"  # an undeclared effect: whoever its arguments name
Audience = frozenset[str] | Literal["public", "args"] | None  # None: nothing leaves the run


def reader(name: str) -> str:
    """A reader's name as labels hold it: lowercased, `Name <a@b.org>` as `a@b.org`."""
    name = name.strip()
    if name.endswith(">") and "<" in name:
        name = name[name.rindex("<") + 1:-1]
    return name.strip().lower()


def readers_in(value: Any) -> set[str]:
    """The reader names in a field's value: a string, a list of strings, or a dict's keys (a file's
    `shared_with: {address: permission}`); anything else names nobody."""
    items: list[Any] = list(value) if isinstance(value, (list, dict)) else [value]  # pyright: ignore[reportUnknownArgumentType]
    return {reader(x) for x in items if isinstance(x, str) and x.strip()}


def declared_readers(tool: Tool, declared: Declares | None = None) -> frozenset[str] | tuple[str, ...] | None:
    """The readers a tool's output has by declaration: None (public), a set (`{USER}`, or the empty
    set: secret), or the output's fields that name readers besides the user. `declared`: `tool.declared`,
    if the caller has read it already."""
    d = tool.declared if declared is None else declared
    decl = d.output_readers
    if isinstance(decl, tuple):
        return decl
    if decl == "public":
        return None
    if decl == "secret" or (decl is None and d.secret_output):
        return frozenset()
    if decl == "user" or d.private_output:
        return frozenset({USER})
    return None


def record_label(fields: tuple[str, ...], record: dict[str, Any]) -> Label:
    """The label a record of the output carries: readable by the user and whoever its fields name."""
    names: set[str] = {USER}
    for f in fields:
        names |= readers_in(record.get(f))
    return Label(readers=frozenset(names))


def output_label(tool: Tool, content: str) -> Label:
    """The readers of a whole output (the loop's hidden value, one text): by declaration; with
    reader fields, each record's readers joined (a list of e-mails: who may read every one of them).
    An output that is no JSON record, or a list of none, is the user's alone (fail closed)."""
    decl = declared_readers(tool)
    if not isinstance(decl, tuple):
        return TRUSTED if decl is None else Label(readers=decl)
    try:
        data: Any = json.loads(content)
    except ValueError:
        return Label(readers=frozenset({USER}))
    records = [data] if isinstance(data, dict) else [r for r in data if isinstance(r, dict)] \
        if isinstance(data, list) else []
    if not records:
        return Label(readers=frozenset({USER}))
    return join_all(record_label(decl, r) for r in records)  # pyright: ignore[reportUnknownArgumentType]


def audience(tool: Tool, args: dict[str, Any]) -> Audience:
    """Who reads what a call of `tool` with `args` sends: a set of reader names (the user always
    among them), PUBLIC, WHERE_ARGS_SAY (an undeclared effect), or None (nothing leaves the run)."""
    d = tool.declared
    decl = d.sends_to
    if isinstance(decl, tuple):
        names = {USER}
        for a in decl:
            names |= readers_in(args.get(a))
        return frozenset(names)
    if decl == "user":
        return None
    if decl == "public" or (decl is None and d.url_args):
        return PUBLIC
    if d.writes_path or (tool.effect_declared and tool.effect.value == "read_only"):
        return None
    return WHERE_ARGS_SAY


def leak(tool: Tool, args: dict[str, Any], label: Label, carriers: Iterable[str],
         by_user: Callable[[tuple[str, ...]], bool]) -> str | None:
    """Why a call would let data labelled `label` reach someone outside its readers (None: it would
    not). `carriers`: the arguments that hold that data; `by_user(names)`: whether those arguments
    (and what the call is made under) come from the user's request alone, which makes the readers
    they name the user's choice. Secrets are not judged here (they go to a `secret_sink` only)."""
    if label.readers is None or label.secret:
        return None
    to = audience(tool, args)
    if to is None:
        return None
    carried = sorted(carriers) or ["its arguments"]
    what = f"private data ({', '.join(carried)}), readable only by {_who(label.readers)},"
    if to == PUBLIC:
        return f"{what} would go to '{tool.name}', which anyone may read"
    if to == WHERE_ARGS_SAY:
        others = tuple(a for a in args if a not in set(carriers))
        if by_user(others):
            return None
        return f"{what} would go where the user did not say ('{tool.name}' sends to whoever its arguments name)"
    outside = to - label.readers
    if not outside:
        return None
    named_by = tuple(a for a in (tool.declared.sends_to or ()) if readers_in(args.get(a)) & outside)
    if named_by and by_user(named_by):
        return None  # the user named them: the user chose who reads it
    n = len(outside)
    return f"{what} would go to {n} reader{'s' if n > 1 else ''} outside them ({', '.join(named_by)})"


def _who(readers: frozenset[str]) -> str:
    others = len(readers - {USER})
    user = "the user" if USER in readers else ""
    if not others:
        return user or "nobody"
    named = f"{others} named reader{'s' if others > 1 else ''}"
    return f"{user} and {named}" if user else named
