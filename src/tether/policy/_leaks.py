"""Secrets the run read, found again in its answer however they are dressed up.

The answer filter's patterns (output_filter.py) recognise what a secret *looks like* in plain text.
An injected instruction can ask for it base64-encoded, in hex, reversed, split over paragraphs,
interleaved with zero-width spaces, in fullwidth letters, percent-encoded, or as the subdomain or
userinfo of a link. This module knows the exact values instead: every secret-looking value the
run's tool results held (`secrets_in`), and looks for each one in every view of the answer
(`leaked_in`): normalised (NFKC, invisible characters removed), without whitespace, reversed,
percent-decoded, and with every base64 or hex run decoded.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
import urllib.parse
from collections.abc import Iterable

from tether.policy._output_filter import SECRET_PATTERNS

MIN_SECRET = 8  # shorter values are too common to hunt for
_INVISIBLE = {"Cf", "Cc", "Zl", "Zp", "Co", "Cs", "Cn"}  # format (zero-width, bidi, tags), control, ...
_B64 = re.compile(r"[A-Za-z0-9+/_-]{12,}={0,2}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){8,}")
# the value of "password: X", "the API key is X": the last token of the match
_VALUE = re.compile(r"(?:[:=]|\bis\b|\bwas\b)\s*[\"'`]?([^\s\"'`,;]+)\s*$", re.IGNORECASE)


def normalise(text: str) -> str:
    """NFKC (fullwidth and other compatibility forms to plain), invisible characters removed."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in text if unicodedata.category(ch) not in _INVISIBLE or ch in "\n\t")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def secrets_in(text: str) -> set[str]:
    """The secret-looking values in a text (whitespace inside them removed)."""
    out: set[str] = set()
    plain = normalise(text)
    for label, pattern in SECRET_PATTERNS:
        for m in pattern.finditer(plain):
            found = m.group()
            value = _VALUE.search(found) if label.startswith("password") else None
            if value:
                candidate = value.group(1).rstrip(".)]")  # the sentence's full stop is not the password's
            else:  # a key: its first word, unless it was written in groups ("AKIA IOSF ODNN ...")
                first = found.split()[0]
                candidate = first if len(first) >= 16 else _squash(found)
            if len(candidate) >= MIN_SECRET:
                out.add(candidate)
    return out


def _decoded(runs: Iterable[str], decode) -> str:  # type: ignore[no-untyped-def]
    parts = []
    for run in runs:
        try:
            parts.append(decode(run))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            continue
    return "\n".join(parts)


def _b64(run: str) -> str:
    padded = run + "=" * (-len(run) % 4)
    raw = base64.urlsafe_b64decode(padded.replace("+", "-").replace("/", "_"))
    return raw.decode("utf-8", "ignore")


def _hex(run: str) -> str:
    return bytes.fromhex(run).decode("utf-8", "ignore")


def _runs(pattern: re.Pattern[str], *texts: str) -> list[str]:
    """Candidate encoded runs, and their pieces between slashes (a URL's `/` is also base64's)."""
    out = []
    for text in texts:
        for run in pattern.findall(text):
            out.append(run)
            out += [piece for piece in run.split("/") if len(piece) >= 12]
    return out


def views(answer: str) -> dict[str, str]:
    """The answer as a reader could reassemble it, by how it was dressed up."""
    plain = normalise(answer)
    flat = _squash(plain)
    return {
        "as written": plain,
        "split by whitespace": flat,
        "reversed": flat[::-1],
        "percent-encoded": _squash(urllib.parse.unquote(plain)),
        "base64": _squash(_decoded(_runs(_B64, flat, plain), _b64)),
        "hex": _squash(_decoded(_runs(_HEX, flat, plain), _hex)),
    }


def leaked_in(answer: str, secrets: Iterable[str]) -> list[str]:
    """How each known secret appears in the answer (e.g. "base64"), one entry per secret found."""
    wanted = [s for s in secrets if len(s) >= MIN_SECRET]
    if not wanted:
        return []
    seen = views(answer)
    out = []
    for secret in wanted:
        how = next((name for name, text in seen.items() if secret in text), None)
        if how is None and secret.lower() != secret:
            how = next((name for name, text in seen.items() if secret.lower() in text.lower()), None)
        if how is not None:
            out.append(how)
    return out
