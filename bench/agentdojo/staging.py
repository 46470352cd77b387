"""Reversible effects staged for one review at the end of the run (issue 44, "stage and hide before you ask").

A calendar event created or moved, a file created, appended to or deleted (into a trash) is undone
without loss, and nobody but the user sees it before it is sent on. Declared `staged=True` to tether,
such a call asks no question when it runs: it lands in a staged layer (here: the run's own copy of the
AgentDojo environment, the view the rest of the run reads), and the person reviews every staged change
once, at the run's end. What the review keeps is applied; what it rejects never happened: the run's
environment is rebuilt from its starting state by replaying every call that ran except the rejected
ones (AgentDojo's tools are deterministic), so a rejected change has no effect and an invitation to
an event's participants goes out only with the kept event. Mail, money and messages are not staged:
they leave the user's hands when they run, so they still ask.

The review is counted apart from questions (`reviews`: runs with at least one staged change, one review
each; `staged_changes`: the changes shown in them). The oracle keeps exactly the user task's actions
(each as often as the task makes it, as it approves questions); deny-all keeps nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentdojo.functions_runtime import FunctionsRuntime

# the tools whose effects the environment can hold back until the review, by suite
STAGED: dict[str, frozenset[str]] = {
    "workspace": frozenset({"create_calendar_event", "reschedule_calendar_event", "create_file", "append_to_file",
                            "delete_file"}),
    "travel": frozenset({"create_calendar_event"}),
    "banking": frozenset(),
    "slack": frozenset(),
}


@dataclass
class Review:
    """One run's end-of-run review."""

    shown: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # the staged changes
    rejected: set[str] = field(default_factory=set)  # call ids the person rejected


def review(suite: str, executed: list[tuple[str, str, dict[str, Any]]], keep: Callable[[str, dict[str, Any]], bool]
           ) -> Review:
    """The staged changes of a run (its executed calls of staged tools), each kept or rejected by `keep`."""
    out = Review()
    for cid, name, args in executed:
        if name in STAGED.get(suite, frozenset()):
            out.shown.append((cid, name, args))
            if not keep(name, args):
                out.rejected.add(cid)
    return out


def oracle_keep(wanted: Counter[str], key: Callable[[str, dict[str, Any]], str]) -> Callable[[str, dict[str, Any]], bool]:
    """The oracle's review: keeps a change while the user task still wants that action."""
    kept: Counter[str] = Counter()

    def keep(name: str, args: dict[str, Any]) -> bool:
        k = key(name, args)
        if kept[k] < wanted[k]:
            kept[k] += 1
            return True
        return False

    return keep


def replay(runtime: FunctionsRuntime, start: Any, executed: list[tuple[str, str, dict[str, Any]]],
           rejected: set[str]) -> tuple[Any, list[tuple[str, str, dict[str, Any]]]]:
    """The environment as if the rejected changes never happened: `start` (a copy is made) with every
    other executed call run again in order. Returns it and the calls that ran in it."""
    env = start.model_copy(deep=True)
    kept = []
    for cid, name, args in executed:
        if cid in rejected:
            continue
        _, error = runtime.run_function(env, name, dict(args))
        if error is None:  # a call that needed a rejected change (appending to a file never created) fails
            kept.append((cid, name, args))
    return env, kept
