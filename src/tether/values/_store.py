"""`ValueStore`: a run's hidden values, each behind a handle, and the substitution of handles in arguments.

A handle is `$v<step>_<n>`: the output of the n-th call (1-based) of the model's turn `step`. It is made
from the call's place in the run, not a counter, so a replayed durable run gives every value the handle
the model saw. An argument may name a whole value (`$v3_1`), a part of a JSON value (`$v3_1.body`,
`$v3_1[0].sender`), or hold handles inside longer text (`"Summary: $v3_1"`), each replaced by the value
(a part that is not text is written as JSON). The call's arguments then carry the join of the labels
of every value substituted. A handle this run does not have is one error the model can act on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tether._errors import InvalidInput
from tether.values._fields import view_line
from tether.values._labels import TRUSTED, Label, join_all
from tether.values._shown import ShownText

HANDLE = re.compile(r"\$v(\d+)_(\d+)((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*)")
_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")
MAX_VALUE_CHARS = 200_000  # a hidden value longer than this keeps its first part (the rest: read_result)
_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"'`]+|\b[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,24}\b", re.IGNORECASE)
MIN_MASKED = 4  # shorter pieces of a value are not masked in messages (they would mask common words)
MAX_ARG_CHARS = 60  # each of the model's own arguments, in a value's description
STORE_VERSION = 1


def handle_for(step: int, index: int) -> str:
    """The handle of the output of call `index` (0-based) of turn `step`."""
    return f"$v{step}_{index + 1}"


@dataclass(slots=True)
class Hidden:
    """One hidden value: the text the model did not see, its label, and what the model was told."""

    value: str
    label: Label
    description: str
    # JSON paths of parts the service vouches for (`[0].amount`): by handle they carry a trusted label
    # (tether.values._fields); any other part, and the whole, carries `label`
    trusted: frozenset[str] = frozenset()


@dataclass(slots=True)
class Binding:
    """What substitution gave one call: where it was in the run, the model's own arguments (handles
    unsubstituted), which argument paths held which handles, and the join of their labels."""

    step: int
    index: int
    model_args: dict[str, Any]
    used: dict[str, list[str]] = field(default_factory=dict)  # argument path -> the handles in it
    label: Label = TRUSTED
    values: list[str] = field(default_factory=list)  # the untrusted texts substituted (followed once sent out)
    guarded: list[tuple[str, str]] = field(default_factory=list)  # (handle, text) of untrusted or secret values
    labels: dict[str, Label] = field(default_factory=dict)  # argument path -> the join of what was put there

    def untrusted_paths(self) -> list[str]:
        """The argument paths an untrusted value was substituted into."""
        return [p for p, label in self.labels.items() if label.untrusted]

    @property
    def quotes_hidden(self) -> bool:
        """Whether a message quoting these arguments would show the model hidden text."""
        return bool(self.guarded)

    def mask(self, text: str) -> str:
        """`text` (a refusal, a held action's line) with each untrusted or secret value substituted into
        this call, in the forms a message quotes it (as is, JSON-escaped, the links and hosts in it),
        replaced by its handle: what the model is told about the call never shows it the value."""
        forms: list[tuple[str, str]] = []
        for ref, value in self.guarded:
            found = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
            for url in _URL.findall(value):
                found.add(url)
                host = urlsplit(url).hostname if "://" in url else url.split("/", 1)[0]
                if host:
                    found.add(host)
            forms += [(f, ref) for f in found if len(f) >= MIN_MASKED]
        for form, ref in sorted(forms, key=lambda fr: -len(fr[0])):
            text = text.replace(form, ref)
        return text


class UnknownHandle(InvalidInput):
    """An argument names a handle this run does not have, or a part its value lacks."""


class ValueStore:
    """The hidden values of one run (JSON-dumped with the policy's state, so resume and fork keep them)
    and the bindings of the calls in flight. `enabled` False: the visible mode (nothing is hidden,
    nothing substituted)."""

    __slots__ = ("bindings", "enabled", "reader", "shown", "values", "written")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        # the name of the run's query tool, None when the agent has none (the executor says, per call):
        # a handle's line and errors name it only when the model can call it
        self.reader: str | None = "inspect_value"
        self.values: dict[str, Hidden] = {}
        self.bindings: dict[str, Binding] = {}  # call id -> its binding, until the call's result is in
        self.written: list[str] = []  # untrusted hidden texts passed to a call: seen again, they taint
        # private texts the model was shown (not hidden), with their readers (tether.values._shown); kept in
        # the visible mode too
        self.shown: list[ShownText] = []

    # -- hiding --------------------------------------------------------------------------------

    def hide(self, handle: str, value: str, label: Label, what: str, shown: str = "",
             trusted: frozenset[str] = frozenset()) -> str:
        """Keep `value` behind `handle`; returns the line the model sees instead (built from `what`,
        the value's size and shape and its label: never from its content), and `shown`: the parts of it
        the service vouches for, whose `trusted` paths then carry a trusted label (tether.values._fields)."""
        line = f"{handle}: {what}, {describe_shape(value)}, {label.describe()}"
        cut = len(value) > MAX_VALUE_CHARS
        self.values[handle] = Hidden(value[:MAX_VALUE_CHARS], label, line, frozenset() if cut else trusted)
        view = view_line(shown) if shown and trusted and not cut else ""
        return f"{line}.{view} {hidden_advice(handle, self.reader)}"

    def get(self, handle: str) -> Hidden | None:
        return self.values.get(handle)

    # -- substitution --------------------------------------------------------------------------

    def bind(self, call_id: str, step: int, index: int, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments with every handle replaced by its value; the binding is kept under `call_id`
        until `take`. Raises UnknownHandle for a handle (or a part) the run does not have."""
        binding = Binding(step, index, arguments)
        for v in arguments.values():
            if isinstance(v, str):
                if "$v" in v:
                    break
            elif isinstance(v, (dict, list)):
                break
        else:  # no handle in any argument (`_sub` would return each as is): nothing to substitute
            self.bindings[call_id] = binding
            return arguments
        labels: list[Label] = []
        out = {k: self._sub(v, str(k), binding, labels) for k, v in arguments.items()}
        binding.label = join_all(labels)
        self.bindings[call_id] = binding
        return out if binding.used else arguments

    def take(self, call_id: str) -> Binding | None:
        """The binding of a call (kept until its result is in), removed."""
        return self.bindings.pop(call_id, None)

    def binding(self, call_id: str) -> Binding | None:
        return self.bindings.get(call_id)

    def _sub(self, v: Any, path: str, binding: Binding, labels: list[Label]) -> Any:
        if isinstance(v, str):
            if "$v" not in v:
                return v
            whole = HANDLE.fullmatch(v.strip())
            if whole is not None:
                value, label = self._resolve(whole)
                self._note(binding, labels, path, whole.group(), value, label)
                return value
            return HANDLE.sub(lambda m: self._inline(m, binding, labels, path), v)
        if isinstance(v, dict):
            return {k: self._sub(x, f"{path}.{k}", binding, labels) for k, x in v.items()}
        if isinstance(v, list):
            return [self._sub(x, f"{path}.{i}", binding, labels) for i, x in enumerate(v)]
        return v

    def _inline(self, m: re.Match[str], binding: Binding, labels: list[Label], path: str) -> str:
        """A handle inside longer text. What follows it reads as a part only of a JSON value: after a
        text value, `$v3_1.Thanks` is the value, then ".Thanks"."""
        try:
            value, label = self._resolve(m)
        except UnknownHandle:
            bare = HANDLE.fullmatch(f"$v{m.group(1)}_{m.group(2)}")
            hidden = self.values.get(bare.group()) if bare is not None and m.group(3) else None
            if hidden is None or hidden.value.lstrip()[:1] in ("{", "["):
                raise
            self._note(binding, labels, path, bare.group(), hidden.value, hidden.label)  # type: ignore[union-attr]
            return hidden.value + m.group(3)
        self._note(binding, labels, path, m.group(), value, label)
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def _note(self, binding: Binding, labels: list[Label], path: str, ref: str, value: Any,
              label: Label) -> None:
        binding.used.setdefault(path, []).append(ref)
        labels.append(label)
        binding.labels[path] = binding.labels.get(path, TRUSTED).join(label)
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if label.untrusted:
            binding.values.append(text)
        if label.untrusted or label.secret:
            binding.guarded.append((ref, text))

    def _resolve(self, m: re.Match[str]) -> tuple[Any, Label]:
        handle = f"$v{m.group(1)}_{m.group(2)}"
        hidden = self.values.get(handle)
        if hidden is None:
            known = ", ".join(list(self.values)[-10:]) or "none yet"
            raise UnknownHandle(f"{handle} is not a value of this run (its values: {known}); pass a handle "
                                "exactly as it was shown")
        if not m.group(3):
            return hidden.value, hidden.label
        try:
            value: Any = json.loads(hidden.value)
        except ValueError:
            raise UnknownHandle(f"{handle} is text, not JSON: it has no part {m.group(3)}; pass {handle} "
                                "whole") from None
        walked, at, vouched = handle, "", False
        for key, idx in _PART.findall(m.group(3)):
            if key and isinstance(value, dict) and key in value:
                value = value[key]
            elif idx and isinstance(value, list) and int(idx) < len(value):
                value = value[int(idx)]
            else:
                part = f".{key}" if key else f"[{idx}]"
                raise UnknownHandle(f"{walked} has no part {part}; " + (
                    f"ask {self.reader} about {handle} instead" if self.reader else f"pass {handle} whole"))
            walked += f".{key}" if key else f"[{idx}]"
            at += f".{key}" if key else f"[{idx}]"
            vouched = vouched or at in hidden.trusted  # a part of a vouched part (a list field's item) too
        if vouched and not hidden.label.secret:  # a part the service vouches for: its readers only
            return value, Label(readers=hidden.label.readers)
        return value, hidden.label

    # -- the answer ----------------------------------------------------------------------------

    def render(self, text: str) -> tuple[str, list[str]]:
        """The answer with each handle replaced by its value for the user (who may read their own
        data), except secret ones (but a yes/no about one), replaced by a placeholder; returns (text, the
        handles withheld)."""
        if "$v" not in text or not self.values:
            return text, []
        withheld: list[str] = []

        def one(m: re.Match[str]) -> str:
            try:
                value, label = self._resolve(m)
            except UnknownHandle:
                return m.group()
            # a yes/no about a secret (the query's boolean answer: "is DB_HOST set in .env?") is one bit the
            # user asked for; the secret itself, or any longer answer about it, stays withheld
            if not (label.secret and _yes_no(value)) and (label.secret or not label.may_read("user")):
                withheld.append(m.group())
                return f"[{m.group()}: a secret value, not shown]"
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

        return HANDLE.sub(one, text), withheld

    # -- state ---------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueStore) and self.dump() == other.dump()

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by content, not hashable

    def dump(self) -> dict[str, Any]:
        return {"version": STORE_VERSION, "enabled": self.enabled, "written": list(self.written),
                "values": {h: {"value": v.value, "label": v.label.to_dict(), "description": v.description,
                               **({"trusted": sorted(v.trusted)} if v.trusted else {})}
                           for h, v in self.values.items()},
                **({"shown": [{"text": s.text, "label": s.label.to_dict()} for s in self.shown]} if self.shown else {})}

    @classmethod
    def load(cls, data: Any) -> ValueStore:
        if not isinstance(data, dict) or data.get("version") != STORE_VERSION:
            raise InvalidInput(f"hidden values of version {data.get('version') if isinstance(data, dict) else None!r}"
                               f" are not supported (expected {STORE_VERSION})")
        store = cls(bool(data.get("enabled", True)))
        store.written = [str(w) for w in data.get("written") or ()]
        store.shown = [ShownText(str(s["text"]), Label.from_dict(s["label"])) for s in data.get("shown") or ()]
        for h, v in dict(data.get("values") or {}).items():
            store.values[str(h)] = Hidden(str(v["value"]), Label.from_dict(v["label"]), str(v["description"]),
                                          frozenset(str(p) for p in v.get("trusted") or ()))
        return store


def hidden_advice(handle: str, reader: str | None) -> str:
    """What a handle's line tells the model it can do with the value: ask the run's query tool about it
    only when the agent has one (a hand-built executor may not)."""
    if reader:
        return f"The value is hidden from you: pass {handle} as an argument to use it, or ask {reader} about it."
    return (f"The value is hidden from you, and this agent has no tool to read it: pass {handle} as an argument "
            f"where the value is needed, or write {handle} in your final answer to show it to the user.")


def describe_shape(value: str) -> str:
    """Size and shape only: never a key (an untrusted object's keys are text its author chose)."""
    size = f"{len(value):,} characters"
    stripped = value.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            parsed = json.loads(value)
        except ValueError:
            return size
        if isinstance(parsed, list):
            return f"{size}, a JSON list of {len(parsed):,} item{'s' if len(parsed) != 1 else ''}"
        if isinstance(parsed, dict):
            return f"{size}, a JSON object"
    return size


def describe_call(tool: str, model_args: dict[str, Any]) -> str:
    """`read_email(id=3)`: the call as the model wrote it (its own arguments, each cut short)."""
    parts = []
    for k, v in model_args.items():
        text = json.dumps(v, ensure_ascii=False)
        parts.append(f"{k}={text if len(text) <= MAX_ARG_CHARS else text[:MAX_ARG_CHARS] + '...'}")
    return f"{tool}({', '.join(parts)})"


def values_of(state: Any) -> ValueStore | None:
    """The hidden values of a run's policy state, when it keeps them and hiding is on."""
    store = getattr(state, "values", None)
    return store if isinstance(store, ValueStore) and store.enabled else None


def _yes_no(value: Any) -> bool:
    """A boolean answer, as the query stores it (True, or its JSON text)."""
    return isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in ("true", "false"))
