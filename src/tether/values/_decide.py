"""What the safety policy asks of hidden values: hide an output, judge a call's substituted arguments.

Kept apart from tether.policy so the policy calls it at three points only (after a call, before a call,
the final answer). Exact data flow: labels come from the executor's substitution, never from matching text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether._types import ToolResult
from tether.tools._base import Tool
from tether.tools._declares import Declares
from tether.values import _shown as shown
from tether.values._declare import QUERY_KEY, hides
from tether.values._defang import defang
from tether.values._fields import NOTHING, split_fields, trusted_fields_of
from tether.values._labels import TRUSTED, Label, join_all, untrusted
from tether.values._readers import audience, declared_readers, leak
from tether.values._readers import output_label as readers_label
from tether.values._store import Binding, ValueStore, describe_call, handle_for

MIN_FOLLOWED = 8  # a substituted text shorter than this is not followed into later outputs (too common)
MAX_FOLLOWED = 200


def output_label(tool: Tool, binding: Binding | None, *, is_untrusted: bool, secret_from: str | None) -> Label:
    """The label of a call's output: its source's own, joined with what its arguments carried (an
    answer computed from a hidden value is as untrusted, and as secret, as that value)."""
    label = untrusted(tool.name) if is_untrusted else TRUSTED
    if secret_from is not None:
        label = label.join(Label("trusted", frozenset({secret_from}), frozenset()))
    return label if binding is None or binding.label is TRUSTED else label.join(binding.label)


def maybe_hide(store: ValueStore | None, tool: Tool, args: dict[str, Any] | None, binding: Binding | None,
               result: ToolResult, label: Label, declared: Declares | None = None, *,
               secret_from: str | None = None) -> bool:
    """Keep the output behind a handle when hiding is on, the call hides (declared, or the query's free
    text; or it read `secret_from`, a secret-bearing source such as `.env`, whatever the tool), the output
    is untrusted or secret, and it is not an error (whose text is the tool's own). Replaces
    `result.content` with the handle's line; True when it did. `declared`: `tool.declared`, if the caller
    has read it already."""
    if store is None or not store.enabled or binding is None or result.is_error:
        return False
    job = result.job if isinstance(result.job, dict) and isinstance(result.job.get("label"), dict) else None
    if job is not None:  # a background job's output, delivered (job_status, job_wait): hidden by its tool's rule
        # its own label (its tool, the values it was given) stands for the delivering call's source
        own = Label.from_dict(job["label"]).join(binding.label)
        label = own if own.untrusted or not label.untrusted else own.join(label)
    if declared is None:
        declared = tool.declared
    if declared.output_readers is not None:  # its declared readers (tether.values._readers) ride along
        label = label.join(readers_label(tool, result.content))
    private = label.readers is not None and bool(declared.output_readers or tool.metadata.get(QUERY_KEY))
    if not (label.untrusted or label.secret or private):
        return False
    # any answer about a secret stays a handle: even a boolean shown would tell the model a bit of it
    if job is None and secret_from is None and not hides(tool, args) and not (
            label.secret and tool.metadata.get(QUERY_KEY)):
        return False
    handle = handle_for(binding.step, binding.index)
    if job is not None:
        what = f"output of job {job.get('id')}, " + describe_call(str(job.get("tool")), dict(job.get("arguments") or {}))
    else:
        what = ("answer of " if tool.metadata.get(QUERY_KEY) else "output of ") + describe_call(tool.name,
                                                                                              binding.model_args)
    parts = NOTHING
    fields = trusted_fields_of(declared) if job is None and not tool.metadata.get(QUERY_KEY) else None
    # split only an output the tool itself made untrusted, or one whose untrusted arguments are all payload
    # (a new file's content: which record comes back is not theirs to choose); one an untrusted argument
    # selected (the records a search returns) or a secret one keeps a single label
    if fields is not None and not label.secret and _selected_by_trusted(tool, declared, args, binding):
        parts = split_fields(result.content, fields, handle)
        if parts.shown and label.readers is not None:  # private: what it shows is followed by its readers
            shown.note(store.shown, [(parts.shown, Label(readers=label.readers))])
    result.content = store.hide(handle, result.content, label, what, parts.shown, parts.paths)
    result.handle = None
    return True


def _selected_by_trusted(tool: Tool, declared: Declares, args: dict[str, Any] | None, binding: Binding) -> bool:
    """Whether no untrusted value chose which records a call returns: none was substituted into it, or
    only into its declared payload arguments."""
    if not binding.label.untrusted:
        return True
    payload = payload_args(tool, declared.risk_free_args, declared.guarded_args, args or binding.model_args)
    return bool(payload) and not checked_untrusted(binding, payload)


def note_shown(store: ValueStore | None, tool: Tool, binding: Binding | None, content: str, *,
               is_error: bool, declared: Declares | None = None) -> None:
    """An output the model is shown as it is: the texts of it that have readers (declared, or carried by
    the hidden values it was computed from) are remembered, so a call copying them is judged by their
    readers (tether.values._shown). An error's text is the tool's own."""
    if store is None or is_error:
        return
    decl = declared_readers(tool, declared)
    label = Label(readers=decl) if isinstance(decl, frozenset) else TRUSTED
    if binding is not None and binding.label.readers is not None:
        label = label.join(Label(readers=binding.label.readers))
    if label.readers is None and not isinstance(decl, tuple):
        return  # public: nothing to follow (the common case, kept cheap)
    shown.note(store.shown, shown.private_texts(tool, content, label))


def shown_leak(store: ValueStore | None, tool: Tool, args: dict[str, Any], skip: set[str],
               by_user: Callable[[tuple[str, ...]], bool]) -> str | None:
    """Why this call would send text copied from a private output the model was shown to someone outside
    its readers (None: it would not, or it copies none). `skip`: arguments the user wrote themselves."""
    if store is None or not store.shown or audience(tool, args) is None:
        return None
    copied = shown.copied_labels(store.shown, args, skip)
    if not copied:
        return None
    return leak(tool, args, join_all(copied.values()), copied, by_user)


def job_hides(store: ValueStore | None, tool: Tool, args: dict[str, Any], binding: Binding | None, *,
              untrusted: bool, secret_from: str | None = None) -> dict[str, Any] | None:
    """For a call that starts a background job (`untrusted`: its source is; `secret_from`: the
    secret-bearing source it reads, a `.env` its command names): the label its output will carry (as a
    dict), when that output is to be hidden once delivered (hiding on, and the call hides and its output
    is untrusted or secret, or it reads a secret source: a job's output read from `.env` is delivered as a
    secret handle, passed only where secrets may go); else None, and the job's result is shown as it is."""
    if secret_from is None and tool.declared.secret_output:
        secret_from = tool.name
    if store is None or not store.enabled or not (hides(tool, args) or secret_from is not None):
        return None
    label = output_label(tool, binding, is_untrusted=untrusted, secret_from=secret_from)
    return label.to_dict() if label.untrusted or label.secret else None


def sink_refusal(tool: Tool, binding: Binding | None) -> str | None:
    """A secret value passed by handle goes only to the query (which reads it for the run) or to a tool
    declared `secret_sink` (a login, a vault); to any other tool it would leave the run."""
    if binding is None or not binding.used or not binding.label.secret:
        return None
    if tool.metadata.get(QUERY_KEY) or tool.declared.secret_sink:
        return None
    refs = ", ".join(sorted({r for rs in binding.used.values() for r in rs}))
    return (f"it would pass {refs}, a secret value ({binding.label.describe()}), to '{tool.name}', which is not "
            "declared to take secrets; secrets must not leave the run")


def leak_reason(tool: Tool, binding: Binding | None, args: dict[str, Any]) -> str | None:
    """Why this call would send a hidden value to someone outside its readers (tether.values._readers):
    the carriers are the arguments a value with readers was substituted into. What the deciding model
    wrote is not known to come from the user's request (plan mode knows it of the plan's literals), so
    no reader it names counts as the user's choice: outside the readers, a person decides."""
    if binding is None or not binding.used or binding.label.readers is None:
        return None
    carriers = {p.split(".", 1)[0] for p, label in binding.labels.items() if label.readers is not None}
    return leak(tool, args, binding.label, carriers, lambda names: False)


def untrusted_reason(binding: Binding | None) -> str | None:
    """Why an effect with this binding needs a person: an argument is a value someone else wrote."""
    if binding is None or not binding.label.untrusted:
        return None
    paths = ", ".join(f"{p} = {' '.join(rs)}" for p, rs in binding.used.items())
    return (f"its arguments carry hidden values from outside this conversation ({paths}: "
            f"{binding.label.describe()})")


def payload_args(tool: Tool, risk_free: tuple[str, ...] | None, guarded: tuple[str, ...] | None,
                 args: dict[str, Any]) -> frozenset[str]:
    """The top-level arguments of this call that are payload (text for a person, derived from what was
    read): the declared `risk_free_args`, else every argument not among a declared `guarded_args`; none
    when the tool declares neither (fail closed). URL arguments and the written path are never payload."""
    if isinstance(risk_free, tuple):
        payload = frozenset(risk_free)
    elif isinstance(guarded, tuple):
        payload = frozenset(args) - frozenset(guarded)
    else:
        return frozenset()
    declared = tool.declared
    return payload - frozenset(declared.url_args) - ({declared.writes_path} if declared.writes_path else set())


def checked_untrusted(binding: Binding, payload: frozenset[str]) -> list[str]:
    """The argument paths carrying an untrusted value that are not payload (a recipient, an amount, a path)."""
    return [p for p in binding.untrusted_paths() if p.split(".", 1)[0] not in payload]


def defang_payload(args: dict[str, Any], binding: Binding) -> tuple[dict[str, Any], list[str]] | None:
    """`args` with every text under an argument path that carries an untrusted value defanged (links and
    host names made inert, tether.values._defang; the whole text, the model's own words in it too), and
    the paths changed. None when a value there is not plain JSON (it cannot be rewritten: ask instead)."""
    out = dict(args)
    changed: list[str] = []
    for path in binding.untrusted_paths():
        keys = path.split(".")
        try:
            out = _rewrite(out, keys)
        except _NotPlain:
            return None
        if _at(out, keys) != _at(args, keys):
            changed.append(path)
    return out, changed


class _NotPlain(Exception):
    pass


def _defang_all(value: Any) -> Any:
    if isinstance(value, str):
        return defang(value)
    if isinstance(value, dict):
        mapping: dict[Any, Any] = value
        return {defang(k) if isinstance(k, str) else k: _defang_all(v) for k, v in mapping.items()}
    if isinstance(value, list | tuple):
        seq: list[Any] | tuple[Any, ...] = value
        return type(seq)(_defang_all(v) for v in seq)
    if value is None or isinstance(value, bool | int | float):
        return value
    raise _NotPlain


def _rewrite(container: Any, keys: list[str]) -> Any:
    """A copy of `container` with the value at `keys` defanged (the copies made only along the path)."""
    if not keys:
        return _defang_all(container)
    head, rest = keys[0], keys[1:]
    if isinstance(container, dict) and head in container:
        return {**container, head: _rewrite(container[head], rest)}
    if isinstance(container, list) and head.isdigit() and int(head) < len(container):
        copy = list(container)  # pyright: ignore[reportUnknownArgumentType]
        copy[int(head)] = _rewrite(copy[int(head)], rest)
        return copy
    raise _NotPlain


def _at(container: Any, keys: list[str]) -> Any:
    for k in keys:
        container = container[int(k)] if isinstance(container, list) else container[k]
    return container


def argument_origins(binding: Binding | None) -> dict[str, str]:
    """Argument path -> what was substituted there and its label (shown with an approval prompt)."""
    if binding is None:
        return {}
    return {p: f"{' '.join(rs)} ({binding.label.describe()})" for p, rs in binding.used.items()}


def note_sent(store: ValueStore, tool: Tool, binding: Binding | None) -> None:
    """Untrusted texts a call sent out (written to a file, a record, a message): seen again in an output
    the model will read, that output is treated as untrusted (the value came back visible). The query
    sends nothing out."""
    if binding is not None and not tool.metadata.get(QUERY_KEY):
        if binding.values:  # (none: no generator frame)
            store.written.extend(v for v in binding.values if len(v) >= MIN_FOLLOWED and v not in store.written)
        del store.written[:-MAX_FOLLOWED]  # the latest ones (each is searched for in every shown output)


def came_back(store: ValueStore | None, content: str) -> bool:
    """Whether an output holds an untrusted hidden text a call sent out."""
    if store is None or not store.written:  # (none sent: no generator frame)
        return False
    return any(w in content for w in store.written)
