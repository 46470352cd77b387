"""Taint and per-value provenance for one run.

The run is tainted once any untrusted text (web pages, email, files, shell output, retrieved
documents, MCP results, tool outputs flagged untrusted) has reached the model; taint never goes
down. Each value the model passes in a tool argument is traced to where it could have come from,
in this order of precedence:

- `user`: it appears in the user's own messages;
- `untrusted`: it appears in untrusted text, or was written by a call made after taint (a value
  keeps that origin wherever it travels: written into a record and read back through a trusted
  tool, it is still untrusted);
- `trusted`: it appears only in trusted tool outputs;
- `model`: it appears nowhere (the model wrote it; after taint the model may be compromised);
- `neutral`: carries no information (booleans, None, empty strings).

Matching is on normalised text: Unicode-compatibility-folded, case-folded, whitespace-collapsed,
on token boundaries (a joiner such as `-` or `@` between word characters glues, so "13" is not
found in "2024-05-13"); numbers are matched as numbers (`50`, `50.0`, `$50.00` and `1,000` all
match their values). On the untrusted side matching is looser, so a value cannot shed its origin by
re-spacing or re-punctuating: an identifier is also found when only its letters and digits match
("GB29 NWBK 6016" is "gb29nwbk6016"), and percent-, HTML- and base64-encoded text is decoded first.
"""

from __future__ import annotations

import base64
import binascii
import enum
import html
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from tether.policy._canonical import leaves
from tether.policy._egress import split_sentence_ends


class Origin(enum.StrEnum):
    USER = "user"
    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"
    MODEL = "model"
    NEUTRAL = "neutral"


#: origins that count as "provided by the user" for the taint rule
SAFE_ORIGINS = frozenset({Origin.USER, Origin.TRUSTED, Origin.NEUTRAL})

# numbers standing alone: not parts of dates, times, ids or versions ("2024-05-13" holds no 13)
_NUM = re.compile(r"(?<![\w.\-/:])[-+]?\d[\d,]*(?:\.\d+)?(?![\w\-/:]|\.\d)")
_JOINERS = "-_/:@.#+"
_STRIP = ".,;:!?'\"()[]{}<>*`"
MAX_WORDS = 60  # longer values are matched as a whole only
MIN_TRACE_CHARS = 4  # shorter numeric strings ("13", "5") are too likely to match by coincidence
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-_/.@+]{4,}[A-Za-z0-9]")


def _norm(text: str) -> str:
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    # split() breaks on exactly the characters regex \s matches: each whitespace run becomes one space.
    # lower(), not casefold(): casefold maps "ß" to "ss", making www.straße-news.com the user's
    # www.strasse-news.com, another domain (matching less is the safe direction)
    return " ".join(text.lower().split())


_SQUASH = re.compile(r"[\W_]+")
MIN_SQUASH = 6  # shorter letter-and-digit runs match too much by coincidence
_B64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")


def squash(text: str) -> str:
    """Only the letters and digits, case-folded: the form spacing and punctuation cannot change."""
    return _SQUASH.sub("", _norm(text))


def decodings(text: str) -> list[str]:
    """`text` and what common encodings inside it decode to (percent, HTML entities, base64)."""
    out = [text]
    if "%" in text:
        out.append(unquote(text))
    if "&" in text:
        out.append(html.unescape(text))
    for m in _B64.finditer(text):
        blob = m.group()
        try:
            raw = base64.b64decode(blob + "=" * (-len(blob) % 4), altchars=b"-_" if "-" in blob or "_" in blob else None)
            decoded = raw.decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        if decoded.isprintable():
            out.append(decoded)
    return out


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
    tokens, so a text lacking one of the value's tokens cannot match. Texts are indexed when the
    corpus is next searched, not as they are added: a run that never looks a value up in one origin
    (the usual trusted side: short arguments are only looked for in untrusted text) never indexes it.
    """

    __slots__ = ("_index", "_loose", "_nums", "_squashed", "_texts", "_unindexed")

    def __init__(self, *, loose: bool = False) -> None:
        self._texts: list[str] = []
        self._nums: set[float] = set()
        self._index: dict[str, set[int]] = {}
        self._loose = loose  # also keep letters-and-digits forms (of decoded text) for `has_squashed`
        # those forms, UTF-8, one after another with NUL between (a needle holds no NUL, so a match
        # never spans two texts): one C substring search per lookup, not a Python loop over texts
        self._squashed = bytearray()
        # texts added since the last search, as (place in `_texts`, the text numbers are read from)
        self._unindexed: list[tuple[int, str]] = []

    def add(self, text: str) -> None:
        if text:
            texts, unindexed = self._texts, self._unindexed
            for variant in decodings(text) if self._loose else (text,):
                unindexed.append((len(texts), variant))
                texts.append(_norm(variant))

    def _index_new(self) -> None:
        """Index the texts added since the last search (their tokens, numbers, letters-and-digits form)."""
        index, texts = self._index, self._texts
        for i, variant in self._unindexed:
            self._nums |= _numbers(variant)
            tokens = _TOKEN.findall(texts[i])
            for token in set(tokens):
                ids = index.get(token)
                if ids is None:
                    index[token] = {i}
                else:
                    ids.add(i)
            if self._loose:  # squash(variant), from the tokens at hand: the letter-and-digit runs, joined
                self._add_squashed("".join(tokens))
        self._unindexed = []

    def _add_squashed(self, flat: str) -> None:
        if flat:
            self._squashed += flat.encode("utf-8", "surrogatepass") + b"\x00"

    def has_squashed(self, value: str) -> bool:
        """`value` found when only letters and digits count (re-spaced, re-punctuated)."""
        if self._unindexed:
            self._index_new()
        if not self._squashed:
            return False
        needle = squash(value)
        if len(needle) < MIN_SQUASH:
            return False
        return needle.encode("utf-8", "surrogatepass") in self._squashed

    def __bool__(self) -> bool:
        return bool(self._texts)

    @property
    def texts(self) -> list[str]:
        """The (normalised) texts, in the order added: what `Provenance.dump` keeps."""
        return list(self._texts)

    def add_normalised(self, norm: str) -> None:
        """Re-add a text from `texts` (already normalised and decoded): used by `Provenance.load`."""
        self._unindexed.append((len(self._texts), norm))
        self._texts.append(norm)

    def has_number(self, value: float) -> bool:
        if self._unindexed:
            self._index_new()
        try:
            return float(value) in self._nums
        except OverflowError:  # an int too large for a float matches no number read
            return False

    def _candidates(self, needle: str) -> list[str]:
        if self._unindexed:
            self._index_new()
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
        if not self._texts:
            return False
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
        if not self._texts:  # numbers are only ever read from texts
            return False
        if isinstance(value, (int, float)) and not isinstance(value, bool):
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


_MONEY_WORDS = ("amount", "price", "sum", "total", "balance", "cost", "fee", "value", "pay")


@dataclass
class Provenance:
    """Where values in a run came from; decides the origin of argument values. Taint is one-way."""

    user: Corpus = field(default_factory=Corpus)
    trusted: Corpus = field(default_factory=Corpus)
    untrusted: Corpus = field(default_factory=lambda: Corpus(loose=True))
    _tainted: bool = False
    taint_sources: list[str] = field(default_factory=list)
    # identifiers (letters and digits only) and numbers from private outputs -> source
    private: dict[str, str] = field(default_factory=dict)
    private_numbers: dict[float, str] = field(default_factory=dict)

    @property
    def tainted(self) -> bool:
        return self._tainted

    def dump(self) -> dict[str, Any]:
        """JSON-safe form; `Provenance.load(p.dump())` traces every value as `p` does."""
        return {"user": self.user.texts, "trusted": self.trusted.texts, "untrusted": self.untrusted.texts,
                "tainted": self._tainted, "taint_sources": list(self.taint_sources), "private": dict(self.private),
                "private_numbers": [[n, s] for n, s in self.private_numbers.items()]}

    @classmethod
    def load(cls, data: dict[str, Any]) -> Provenance:
        prov = cls()
        for name in ("user", "trusted", "untrusted"):
            corpus = getattr(prov, name)
            for text in data.get(name, ()):
                corpus.add_normalised(str(text))
        prov._tainted = bool(data.get("tainted"))
        prov.taint_sources = [str(s) for s in data.get("taint_sources", ())]
        prov.private = {str(k): str(v) for k, v in dict(data.get("private", {})).items()}
        prov.private_numbers = {float(n): str(s) for n, s in data.get("private_numbers", ())}
        return prov

    def add_user(self, text: str) -> None:
        self.user.add(text)
        split = split_sentence_ends(text)  # "our site www.x.com.They..." also gives www.x.com
        if split != text:
            self.user.add(split)

    def add_output(self, text: str, *, trusted: bool, source: str, private: bool = False) -> None:
        """Record a tool output; an untrusted one taints the run for good. Identifiers in a
        `private` output (passport, card and account numbers: tokens of 6+ characters with a digit)
        and its numbers (balances) are remembered so they can be found inside outgoing arguments."""
        if private:
            for m in _IDENT.finditer(text):
                tok = m.group()
                if any(c.isdigit() for c in tok) and not self.user.has_text(tok):
                    self.private.setdefault(squash(tok), source)
            for number in _numbers(text):
                if abs(number) >= 10 and not self.user.has_number(number):
                    self.private_numbers.setdefault(number, source)
        if trusted:
            self.trusted.add(text)
        else:
            self.untrusted.add(text)
            self._tainted = True
            if source not in self.taint_sources:
                self.taint_sources.append(source)

    def add_written(self, values: list[Any]) -> None:
        """Values a call made after taint sent out (written into a record, a file, a message): they
        count as untrusted from now on, wherever they come back from."""
        for v in values:
            if isinstance(v, str) and v.strip():
                self.untrusted.add(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                self.untrusted.add(_fmt_number(v))

    def _untrusted_has(self, value: Any) -> bool:
        if self.untrusted.has(value):
            return True
        return isinstance(value, str) and self.untrusted.has_squashed(value)

    def origin(self, value: Any) -> Origin:
        if isinstance(value, str):
            stripped = value.strip()
            if not stripped:
                return Origin.NEUTRAL
            if len(stripped) < MIN_TRACE_CHARS and not stripped.isalpha():
                return Origin.UNTRUSTED if self.untrusted.has(value) else Origin.MODEL
        elif value is None or isinstance(value, bool):
            return Origin.NEUTRAL
        if self.user.has(value):
            return Origin.USER
        if self._untrusted_has(value):
            return Origin.UNTRUSTED
        if self.trusted.has(value):
            return Origin.TRUSTED
        if isinstance(value, str):
            # a value composed of the user's words (e.g. "2024-05-19 12:00" from "on 2024-05-19 at 12:00")
            parts = words(value)
            if 1 < len(parts) <= MAX_WORDS:
                if all(self.user.has(w) for w in parts):
                    return Origin.USER
                if any(not self.user.has(w) and self._untrusted_has(w) for w in parts):
                    return Origin.UNTRUSTED
                if all(self.user.has(w) or self.trusted.has(w) for w in parts):
                    return Origin.TRUSTED
        return Origin.MODEL

    def trace(self, args: dict[str, Any], only: tuple[str, ...] | None = None) -> dict[str, Origin]:
        """Origin of every scalar in `args`, by dotted path (only under the `only` arguments)."""
        if only is not None:
            args = {k: v for k, v in args.items() if k in only}
        origin = self.origin
        out: dict[str, Origin] = {}
        for k, v in args.items():  # flat arguments (the usual case) without `leaves`' list of pairs
            if isinstance(v, (dict, list, tuple)):
                return {path: origin(v) for path, v in leaves(args)}
            out[str(k)] = origin(v)
        return out

    def private_in(self, args: dict[str, Any], skip: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
        """Private data found inside `args` (not under the `skip` paths): {what: source}. Identifiers
        match on letters and digits of the decoded text (re-spaced, re-punctuated, percent- or
        base64-encoded); numbers match as numbers."""
        if not self.private and not self.private_numbers:
            return {}
        found: dict[str, str] = {}
        for path, v in leaves(args):
            if path in skip:
                continue
            if isinstance(v, str) and self.private:
                for variant in decodings(v):
                    flat = squash(variant)
                    for tok, src in self.private.items():
                        if tok in flat:
                            found[tok] = src
            if self.private_numbers:
                for number in _numbers(v) if isinstance(v, str) else (v,) if _is_number(v) else ():
                    source = self.private_numbers.get(float(number))
                    if source is not None:
                        found[_fmt_number(number)] = source
        return found

    @staticmethod
    def all_safe(trace: dict[str, Origin]) -> bool:
        return all(o in SAFE_ORIGINS for o in trace.values())


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_money(path: str) -> bool:
    """An argument that names an amount of money (by its name): `amount`, `price_usd`, `total`..."""
    last = path.rsplit(".", 1)[-1].casefold()
    return any(w in last for w in _MONEY_WORDS)
