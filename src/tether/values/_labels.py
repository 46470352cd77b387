"""`Label`: what a value is (integrity: who could have written it) and who may read it (confidentiality).

Integrity is `trusted` or `untrusted`, with the sources it came from (tool names, call ids, handles).
Confidentiality is a set of readers: `None` is public (anyone), `{USER}` the user, `{USER, "bob@x.org"}`
the user and named recipients, and the empty set is secret (no reader outside the run; only a sink
declared for secrets may take it). Combining values joins their labels: untrusted wins, sources add
up, readers intersect (public is the identity). Nothing ever removes a source or adds a reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from tether._errors import InvalidInput

USER = "user"  # the person the run works for: may read their own data

Integrity = Literal["trusted", "untrusted"]


@dataclass(frozen=True, slots=True)
class Label:
    """Integrity (trusted / untrusted, with its sources) and confidentiality (readers: None is public,
    an empty set is secret)."""

    integrity: Integrity = "trusted"
    sources: frozenset[str] = frozenset()
    readers: frozenset[str] | None = None

    @property
    def untrusted(self) -> bool:
        return self.integrity == "untrusted"

    @property
    def secret(self) -> bool:
        return self.readers is not None and not self.readers

    def join(self, other: Label) -> Label:
        """The label of a value made from both: untrusted if either is, every source, the readers both allow."""
        if other is self or other == TRUSTED:
            return self
        if self == TRUSTED:
            return other
        readers = self.readers if other.readers is None else other.readers if self.readers is None \
            else self.readers & other.readers
        integrity: Integrity = "untrusted" if self.untrusted or other.untrusted else "trusted"
        return Label(integrity, self.sources | other.sources, readers)

    __or__ = join

    def may_read(self, reader: str) -> bool:
        """Whether `reader` (USER, a recipient's address, a sink's name) may read a value with this label."""
        return self.readers is None or reader in self.readers

    def describe(self) -> str:
        """A short plain-language form for prompts and the model (`untrusted (read_email)`, `secret`,
        `readable by the user and 2 named readers`). Reader names are counted, not shown: they come
        from data others wrote (an e-mail's sender) and the deciding model reads this."""
        parts = [self.integrity + (f" ({', '.join(sorted(self.sources))})" if self.sources else "")]
        if self.secret:
            parts.append("secret")
        elif self.readers is not None:
            others = len(self.readers - {USER})
            who = ["the user"] if USER in self.readers else []
            if others:
                who.append(f"{others} named reader{'s' if others > 1 else ''}")
            parts.append("readable by " + " and ".join(who))
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"integrity": self.integrity, "sources": sorted(self.sources),
                "readers": None if self.readers is None else sorted(self.readers)}

    @classmethod
    def from_dict(cls, data: Any) -> Label:
        if not isinstance(data, dict) or data.get("integrity") not in ("trusted", "untrusted"):
            raise InvalidInput(f"not a label: {data!r}")
        readers = data.get("readers")
        return cls(data["integrity"], frozenset(str(s) for s in data.get("sources") or ()),
                   None if readers is None else frozenset(str(r) for r in readers))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, data: str | bytes) -> Label:
        return cls.from_dict(json.loads(data))


TRUSTED = Label()  # the user's and trusted tools' values, public (the identity of `join`)


def untrusted(*sources: str) -> Label:
    """The label of text someone else may have written (a web page, an e-mail), from `sources`."""
    return Label("untrusted", frozenset(sources))


def secret(*sources: str) -> Label:
    """The label of a secret value read from `sources` (environment, `.env`, a key file, a secret tool)."""
    return Label("trusted", frozenset(sources), frozenset())


def join_all(labels: Iterable[Label]) -> Label:
    out = TRUSTED
    for label in labels:
        out = out.join(label)
    return out
