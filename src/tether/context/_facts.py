"""The deterministic half of compaction: lines carrying names, ids, numbers, timestamps or hypotheses
are kept verbatim from what is folded away, so no fact depends on the summarizing model alone."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from tether._types import Message

# ids (INC-4821, tr_77a, db-07), uuids and hex ids, ISO timestamps and clock times, IPs, emails,
# numbers of two digits or more (with units), quoted names
ENTITY = re.compile(
    r"\b[A-Za-z][A-Za-z0-9]*[-_][A-Za-z0-9][\w.-]*\b|\b[0-9a-f]{8,}\b|\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b|\b\d{1,3}(?:\.\d{1,3}){3}\b|\S+@\S+\.\w+|\b\d[\d,.]*\d\b|\"[^\"]{2,40}\"",
)
SEVERE = re.compile(r"\b(error|fatal|critical|panic|exception|traceback|failed|failure|denied|refused|"
                    r"root cause|oom|killed|corrupt)", re.IGNORECASE)
NOTABLE = re.compile(r"\b(warn|warning|timeout|timed out|slow|retry|retrying|degraded|found|changed|deploy)",
                     re.IGNORECASE)
HYPOTHESIS = re.compile(r"\b(hypothes\w*|suspect\w*|likely|probably|because|root cause|conclud\w*|"
                        r"ruled out|confirm\w*|must be|seems|next step)", re.IGNORECASE)
MAX_LINE = 240


def _clip(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def result_facts(text: str, per_result: int = 4) -> list[str]:
    """The most telling lines of a tool result: severe ones first, then notable, each with an entity."""
    severe: list[str] = []
    notable: list[str] = []
    for line in text.splitlines():
        if not ENTITY.search(line):
            continue
        if SEVERE.search(line):
            severe.append(line)
        elif NOTABLE.search(line) and len(notable) < per_result:
            notable.append(line)
    return [_clip(x) for x in (severe + notable)[:per_result]]


def message_facts(message: Message, per_result: int = 4) -> list[str]:
    """Facts to keep from one message being folded away."""
    if message.role == "tool":
        return [f"{message.name or 'tool'}: {x}" for x in result_facts(message.content, per_result)]
    if message.role == "assistant":
        # the model's own reasoning: its hypotheses and the entities it named
        return [f"noted: {_clip(x)}" for x in message.content.splitlines()
                if x.strip() and (HYPOTHESIS.search(x) or ENTITY.search(x))][:per_result]
    if message.role == "user" and message.content.strip():
        return [f"user: {_clip(message.content)}"]
    return []


class FactList:
    """Ordered, de-duplicated facts; past `limit` the oldest are dropped (and counted)."""

    __slots__ = ("_items", "dropped", "limit")

    def __init__(self, limit: int = 80) -> None:
        self.limit = limit
        self._items: dict[str, None] = {}
        self.dropped = 0

    def extend(self, facts: Iterable[str]) -> None:
        for f in facts:
            self._items.pop(f, None)
            self._items[f] = None
        while len(self._items) > self.limit:
            del self._items[next(iter(self._items))]
            self.dropped += 1

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def render(self) -> str:
        return "\n".join(f"- {f}" for f in self._items)
