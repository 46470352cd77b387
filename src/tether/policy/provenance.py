"""Taint and argument provenance for one run.

The run is tainted once any untrusted text (web pages, email, files, retrieved documents, MCP
results, tool outputs flagged untrusted) has reached the model; taint never goes down. Each value
the model passes in a tool argument is traced to where it could have come from:

- `user`: it appears in the user's own request;
- `trusted`: it appears in a trusted tool output;
- `untrusted`: it appears only in untrusted text;
- `model`: it appears nowhere (the model wrote it; after taint the model may be compromised);
- `neutral`: carries no information (booleans, None, empty strings).

Matching is textual: case-folded, whitespace-collapsed, on token boundaries (a joiner such as
`-` or `@` between word characters glues, so "13" is not found in "2024-05-13"); numbers are
matched as numbers (`50`, `50.0`, `$50.00` and `1,000` all match their values); a value of several
words all found in the user's request counts as the user's.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any

from tether.policy.canonical import leaves


class Origin(enum.StrEnum):
    USER = "user"
    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"
    MODEL = "model"
    NEUTRAL = "neutral"


#: origins that count as "provided by the user" for the taint rule
SAFE_ORIGINS = frozenset({Origin.USER, Origin.TRUSTED, Origin.NEUTRAL})

_WS = re.compile(r"\s+")
# numbers standing alone: not parts of dates, times, ids or versions ("2024-05-13" holds no 13)
_NUM = re.compile(r"(?<![\w.\-/:])[-+]?\d[\d,]*(?:\.\d+)?(?![\w\-/:]|\.\d)")
_JOINERS = "-_/:@.#+"
_STRIP = ".,;:!?'\"()[]{}<>*`"
MAX_WORDS = 60  # longer values are matched as a whole only
MIN_TRACE_CHARS = 4  # shorter numeric strings ("13", "5") are too likely to match by coincidence
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-_/.@+]{4,}[A-Za-z0-9]")


def _norm(text: str) -> str:
    return _WS.sub(" ", text.casefold()).strip()


def _numbers(text: str) -> set[float]:
    out: set[float] = set()
    for m in _NUM.finditer(text):
        raw = m.group().replace(",", "")
        try:
            out.add(float(raw))
        except ValueError:
            continue
    return out


def _bounded(text: str, start: int, end: int) -> bool:
    """True when text[start:end] is not glued to neighbouring word characters (a joiner such as
    '-' or '@' between two word characters glues: "13" is not a token of "2024-05-13")."""
    if start > 0 and text[start].isalnum():
        prev = text[start - 1]
        if prev.isalnum() or (prev in _JOINERS and start > 1 and text[start - 2].isalnum()):
            return False
    if end < len(text) and text[end - 1].isalnum():
        nxt = text[end]
        if nxt.isalnum() or (nxt in _JOINERS and end + 1 < len(text) and text[end + 1].isalnum()):
            return False
    return True


def words(value: str) -> list[str]:
    """Whitespace-separated words with surrounding punctuation stripped."""
    out = []
    for w in value.split():
        w = w.strip(_STRIP)
        if w:
            out.append(w)
    return out


_TOKEN = re.compile(r"[^\W_]+")


class Corpus:
    """Texts of one origin, searchable for strings (on token boundaries) and numbers.

    A token -> texts index keeps a lookup proportional to the texts that hold every token of the
    value, not to everything the run has read: a match on token boundaries always covers whole
    tokens, so a text lacking one of the value's tokens cannot match.
    """

    __slots__ = ("_index", "_nums", "_texts")

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._nums: set[float] = set()
        self._index: dict[str, set[int]] = {}

    def add(self, text: str) -> None:
        if text:
            norm = _norm(text)
            i = len(self._texts)
            self._texts.append(norm)
            self._nums |= _numbers(text)
            for token in set(_TOKEN.findall(norm)):
                self._index.setdefault(token, set()).add(i)

    def __bool__(self) -> bool:
        return bool(self._texts)

    @property
    def texts(self) -> list[str]:
        """The (normalised) texts, in the order added: what `Provenance.dump` keeps."""
        return list(self._texts)

    def has_number(self, value: float) -> bool:
        try:
            return float(value) in self._nums
        except OverflowError:  # an int too large for a float matches no number read
            return False

    def _candidates(self, needle: str) -> list[str]:
        tokens = set(_TOKEN.findall(needle))
        if not tokens:
            return self._texts
        sets = []
        for token in tokens:
            ids = self._index.get(token)
            if not ids:
                return []
            sets.append(ids)
        sets.sort(key=len)
        ids = set.intersection(*sets) if len(sets) > 1 else sets[0]
        return [self._texts[i] for i in sorted(ids)]

    def has_text(self, value: str) -> bool:
        needle = _norm(value)
        if not needle:
            return False
        for text in self._candidates(needle):
            start = text.find(needle)
            while start != -1:
                if _bounded(text, start, start + len(needle)):
                    return True
                start = text.find(needle, start + 1)
        return False

    def has(self, value: Any) -> bool:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return self.has_number(value) or self.has_text(_fmt_number(value))
        if isinstance(value, str):
            if self.has_text(value):
                return True
            stripped = value.strip().lstrip("$€£")
            if _NUM.fullmatch(stripped):
                try:
                    return self.has_number(float(stripped.replace(",", "")))
                except ValueError:
                    return False
            return False
        return self.has_text(str(value))


def _fmt_number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if math.isfinite(value) and value.is_integer() else str(value)


@dataclass
class Provenance:
    """Where text in a run came from; decides the origin of argument values. Taint is one-way."""

    user: Corpus = field(default_factory=Corpus)
    trusted: Corpus = field(default_factory=Corpus)
    untrusted: Corpus = field(default_factory=Corpus)
    _tainted: bool = False
    taint_sources: list[str] = field(default_factory=list)
    private: dict[str, str] = field(default_factory=dict)  # identifier from private data -> source

    @property
    def tainted(self) -> bool:
        return self._tainted

    def dump(self) -> dict[str, Any]:
        """JSON-safe form; `Provenance.load(p.dump())` traces every value as `p` does."""
        return {"user": self.user.texts, "trusted": self.trusted.texts, "untrusted": self.untrusted.texts,
                "tainted": self._tainted, "taint_sources": list(self.taint_sources), "private": dict(self.private)}

    @classmethod
    def load(cls, data: dict[str, Any]) -> Provenance:
        prov = cls()
        for name in ("user", "trusted", "untrusted"):
            corpus = getattr(prov, name)
            for text in data.get(name, ()):
                corpus.add(str(text))
        prov._tainted = bool(data.get("tainted"))
        prov.taint_sources = [str(s) for s in data.get("taint_sources", ())]
        prov.private = {str(k): str(v) for k, v in dict(data.get("private", {})).items()}
        return prov

    def add_user(self, text: str) -> None:
        self.user.add(text)

    def vouch(self, values: list[Any]) -> None:
        """Values the user approved in an exact action count as the user's for the rest of the run."""
        for v in values:
            if isinstance(v, str) and v.strip():
                self.user.add(v)
            elif isinstance(v, int | float) and not isinstance(v, bool):
                self.user.add(_fmt_number(v))

    def add_output(self, text: str, *, trusted: bool, source: str, private: bool = False) -> None:
        """Record a tool output; an untrusted one taints the run for good. Identifiers in a
        `private` output (passport, card and account numbers: tokens of 6+ characters with a digit)
        are remembered so they can be found inside outgoing arguments."""
        if private:
            for m in _IDENT.finditer(text):
                tok = m.group()
                if any(c.isdigit() for c in tok) and not self.user.has_text(tok):
                    self.private.setdefault(tok.casefold(), source)
        if trusted:
            self.trusted.add(text)
        else:
            self.untrusted.add(text)
            self._tainted = True
            if source not in self.taint_sources:
                self.taint_sources.append(source)

    def origin(self, value: Any) -> Origin:
        if value is None or isinstance(value, bool):
            return Origin.NEUTRAL
        if isinstance(value, str) and not value.strip():
            return Origin.NEUTRAL
        if isinstance(value, str) and len(value.strip()) < MIN_TRACE_CHARS and not value.strip().isalpha():
            return Origin.UNTRUSTED if self.untrusted.has(value) else Origin.MODEL
        if self.user.has(value):
            return Origin.USER
        if self.trusted.has(value):
            return Origin.TRUSTED
        if isinstance(value, str):
            # a value composed of the user's words (e.g. "2024-05-19 12:00" from "on 2024-05-19 at 12:00")
            parts = words(value)
            if 1 < len(parts) <= MAX_WORDS:
                if all(self.user.has(w) for w in parts):
                    return Origin.USER
                if all(self.user.has(w) or self.trusted.has(w) for w in parts):
                    return Origin.TRUSTED
        if self.untrusted.has(value):
            return Origin.UNTRUSTED
        return Origin.MODEL

    def trace(self, args: dict[str, Any], only: tuple[str, ...] | None = None) -> dict[str, Origin]:
        """Origin of every scalar in `args`, by dotted path (only under the `only` arguments)."""
        if only is not None:
            args = {k: v for k, v in args.items() if k in only}
        return {path or "": self.origin(v) for path, v in leaves(args)}

    def private_in(self, args: dict[str, Any]) -> dict[str, str]:
        """Private identifiers found inside the string values of `args`: {identifier: source}."""
        if not self.private:
            return {}
        found: dict[str, str] = {}
        for _, v in leaves(args):
            if isinstance(v, str):
                low = v.casefold()
                for tok, src in self.private.items():
                    if tok in low:
                        found[tok] = src
        return found

    @staticmethod
    def all_safe(trace: dict[str, Origin]) -> bool:
        return all(o in SAFE_ORIGINS for o in trace.values())
