"""Scan text leaving the agent (final answers, tool arguments) for secrets and exfiltration.

Finds: secrets (API keys, tokens, private keys, passwords), internal URLs, images that point
outside the allowlist (markdown inline and reference images, HTML `<img>` and kin: a client renders
them by fetching the URL, a classic exfiltration channel), and URLs that carry base64 or other long encoded blobs. `filter_output` redacts each
finding and says why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tether.policy._egress import EgressPolicy, find_urls, host_of, is_internal


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # secret | internal_url | markdown_image | html_image | encoded_url | link_with_data | link
    match: str  # the offending text, shortened and masked for secrets
    reason: str


# a key split by single spaces or line breaks ("AKIA IOSF ODNN 7EXA MPLE") is still the key
_SP = r"(?:[ \t]?\n?[ \t]?)"
SECRET_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("AWS access key", re.compile(rf"\b(?:AKIA|ASIA)(?:{_SP}[0-9A-Z]){{16}}\b")),
    ("GitHub token", re.compile(rf"\bgh[pousr]_(?:{_SP}[A-Za-z0-9]){{30,}}\b")),
    ("API key (sk-)", re.compile(rf"\bsk-(?:proj-|ant-)?(?:{_SP}[A-Za-z0-9_-]){{20,}}")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("Google API key", re.compile(rf"\bAIza(?:{_SP}[0-9A-Za-z_-]){{35}}\b")),
    ("private key", re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----[\s\S]*?(?:-----END (?:[A-Z]+ )?PRIVATE KEY-----|$)")),
    ("JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("password or secret assignment",
     re.compile(r"(?i)\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)\b\s*[:=]\s*[\"']?[^\s\"',;]{6,}")),
    # "the password is hunter2!", "my API key was: x9-...": a sentence handing over a secret that
    # has a digit or a symbol in it (so "the password is required" passes)
    ("password or secret in a sentence",
     re.compile(r"(?i)\b(?:password|passphrase|passcode|passwd|pin|secret|api[ _-]?key|access[ _-]?token|"
                r"security code|2fa code|login code)\b(?:\s+for\s+\S+)?\s+(?:is|was|=|:)\s*:?\s*[\"'`]?"
                r"(?=[^\s\"'`]*[\d!@#$%^&*_+=~])[^\s\"'`,;]{4,}")),
]

# Per pattern, literals of which every match holds one: a longer text holding none of a pattern's is
# not scanned by it (a `\b` first keeps the regex engine from searching for the literal itself: ~20 us
# per KB per pattern, the case-insensitive ones ~50). Those of a case-insensitive pattern are looked
# for in `fold(text)`. A short text is tested by one search of all the patterns at once.
_SECRET_LITERALS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "AWS access key": (False, ("AKIA", "ASIA")),
    "GitHub token": (False, ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    "API key (sk-)": (False, ("sk-",)),
    "Slack token": (False, ("xox",)),
    "Google API key": (False, ("AIza",)),
    "private key": (False, ("-----BEGIN ",)),
    "JSON web token": (False, ("eyJ",)),
    "password or secret assignment": (True, ("passw", "pwd", "secret", "api", "token")),
    "password or secret in a sentence": (True, ("pass", "pin", "secret", "api", "token", "code")),
}
_SECRET_CHECKS = [(label, pattern, *_SECRET_LITERALS[label]) for label, pattern in SECRET_PATTERNS]
_ANY_SECRET = re.compile("|".join(  # a match of any pattern (an alternation matches where one of them does)
    f"(?i:{p.pattern.removeprefix('(?i)')})" if p.pattern.startswith("(?i)") else f"(?:{p.pattern})"
    for _, p in SECRET_PATTERNS))
ANY_SECRET = _ANY_SECRET  # (read by tether.policy._leaks.secrets_in for a short text, without a frame)
SHORT_TEXT = 256  # up to this many characters, one search of `_ANY_SECRET` costs less than the literal tests

# The only characters case-insensitive matching equates with ASCII letters besides ASCII's own, mapped
# to them: after this, `lower()` is one character for one and holds an ASCII letter exactly where a
# case-insensitive match could see one.
_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})


def fold(text: str) -> str:
    """`text` lower-cased, as case-insensitive matching sees its letters (see `_FOLD`)."""
    return (text if text.isascii() else text.translate(_FOLD)).lower()


def secret_patterns_for(text: str) -> list[tuple[str, re.Pattern[str]]]:
    """The patterns of SECRET_PATTERNS that may match `text`; a pattern left out matches nowhere in it."""
    if len(text) <= SHORT_TEXT:
        return SECRET_PATTERNS if _ANY_SECRET.search(text) is not None else []
    folded = ""
    out = []
    for label, pattern, folds, literals in _SECRET_CHECKS:
        if folds and not folded:
            folded = fold(text)
        hay = folded if folds else text
        for literal in literals:
            if literal in hay:
                out.append((label, pattern))
                break
    return out


_DEST = re.compile(r"\(\s*<?([^)\s>]*)[^)]*\)")  # an inline destination: (url "title")
_REF_USE = re.compile(r"\s?\[((?:\\.|[^\[\]\\]){0,999})\]")  # [label] after an image's text
_REF_DEF = re.compile(r"^ {0,3}\[((?:\\.|[^\[\]\\]){1,999})\]:[ \t]*\n?[ \t]*<?([^\s>]+)>?", re.MULTILINE)
# tags a renderer fetches by itself, and the attributes holding what it fetches
_HTML_TAG = re.compile(r"<\s*(?:img|image|picture|source|video|audio|track|iframe|frame|embed|object|input|use|svg)\b"
                       r"[^>]*>?", re.IGNORECASE)
_HTML_ATTR = re.compile(r"""(?:^|[\s"'/])(?:src|srcset|poster|data|href|xlink:href|background)\s*=\s*"""
                        r"""("[^"]*"|'[^']*'|[^\s>]+)""", re.IGNORECASE)


def _norm_label(label: str) -> str:
    return " ".join(label.split()).casefold()


def _brackets(text: str) -> dict[int, int]:
    """Position of each `[` -> position of the `]` closing it (nested brackets and backslash
    escapes respected, as CommonMark does for link text). One pass over the text."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    j, n = 0, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            stack.append(j)
        elif c == "]" and stack:
            pairs[stack.pop()] = j
        j += 1
    return pairs


def _images(text: str) -> list[tuple[int, int, str, str]]:
    """Every image a renderer would fetch by itself: (start, end, url, kind). Markdown inline
    images (`![alt](url)`, brackets nested in the alt text too), reference images (`![alt][ref]`,
    `![ref]` with a `[ref]: url` definition anywhere) and HTML tags (`<img src=...>`, srcset, ...)."""
    out: list[tuple[int, int, str, str]] = []
    labels: set[str] = set()  # reference labels used by images
    pairs: dict[int, int] | None = None
    start = text.find("![")
    while start != -1:
        if pairs is None:
            pairs = _brackets(text)
        close = pairs.get(start + 1, -1)
        if close != -1:
            dest = _DEST.match(text, close + 1)
            if dest is not None:
                out.append((start, dest.end(), dest.group(1), "markdown_image"))
            else:
                ref = _REF_USE.match(text, close + 1)
                label = ref.group(1) if ref is not None and ref.group(1).strip() else text[start + 2:close]
                labels.add(_norm_label(label))
        start = text.find("![", start + 2)
    if labels:
        for m in _REF_DEF.finditer(text):
            if _norm_label(m.group(1)) in labels:
                out.append((m.start(), m.end(), m.group(2), "markdown_image"))
    for tag in _HTML_TAG.finditer(text):
        for attr in _HTML_ATTR.finditer(tag.group()):
            for part in attr.group(1).strip("\"'").split(","):  # srcset: "url 1x, url 2x"
                url = part.strip().split(" ")[0]
                if url:
                    out.append((tag.start(), tag.end(), url, "html_image"))
    return out
_BLOB = re.compile(r"[A-Za-z0-9+/_%-]{32,}={0,2}")


_LINK = re.compile(r"(?<!!)\[[^\[\]\n]{0,500}\]\(\s*<?([^)\s>]+)>?[^)]*\)")
_QUERY_VALUE = re.compile(r"[=/]([^&=#/]{8,})")


def _links(text: str) -> list[tuple[int, int, str]]:
    """Markdown links (not images): (start, end, url)."""
    return [(m.start(), m.end(), m.group(1)) for m in _LINK.finditer(text)]


def _query_data(url: str) -> bool:
    """The URL's query string or fragment carries a value of 8+ characters (`?q=<data>`)."""
    rest = url.split("?", 1)[1] if "?" in url else url.split("#", 1)[1] if "#" in url else ""
    return bool(rest) and bool(_QUERY_VALUE.search("=" + rest if "=" not in rest else rest))


def _mask(text: str) -> str:
    return text[:4] + "..." + f"({len(text)} chars)" if len(text) > 8 else "***"


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _encoded_blob(url: str) -> str | None:
    rest = url.split("?", 1)[1] if "?" in url else url.split("/", 3)[-1] if url.count("/") >= 3 else ""
    m = _BLOB.search(rest)
    return m.group() if m else None


def scan(text: str, *, egress: EgressPolicy | None = None) -> list[tuple[int, int, Finding]]:
    """All findings in `text` with their spans (start, end), in order, not overlapping."""
    allow = egress or EgressPolicy()
    spans: list[tuple[int, int, Finding]] = []
    for label, pattern in secret_patterns_for(text):
        for m in pattern.finditer(text):
            spans.append((m.start(), m.end(), Finding("secret", _mask(m.group()),
                                                      f"looks like a {label}; secrets must not leave the run")))
    for start, end, url, kind in _images(text):
        host = host_of(url)
        if not allow.allows_host(host):
            what = "markdown image" if kind == "markdown_image" else "HTML image"
            spans.append((start, end, Finding(
                kind, _short(text[start:end]),
                f"{what} loads from '{host or url}', which is not allowlisted (the viewer would "
                "send data to it)")))
    for start, end, url in _links(text):
        host = host_of(url)
        if not allow.allows_host(host) and not is_internal(host) and _query_data(url):
            spans.append((start, end, Finding(
                "link_with_data", _short(text[start:end]),
                f"link to '{host}' carries data in its query string (a click would send it there)")))
    for m in re.finditer(r"""(?:https?://|www\.)[^\s<>"'`)\]]+""", text, re.IGNORECASE):
        url = m.group().rstrip(".,;:!?")
        host = host_of(url)
        if allow.allows_host(host):
            continue
        if is_internal(host):
            spans.append((m.start(), m.start() + len(url), Finding(
                "internal_url", _short(url), f"'{host}' is an internal address")))
            continue
        blob = _encoded_blob(url)
        if blob is not None:
            spans.append((m.start(), m.start() + len(url), Finding(
                "encoded_url", _short(url),
                f"URL to '{host}' carries an encoded blob ({len(blob)} chars): possible exfiltration")))
    spans.sort(key=lambda s: (s[0], -s[1]))
    merged: list[tuple[int, int, Finding]] = []
    for start, end, finding in spans:
        if merged and start < merged[-1][1]:
            continue  # inside an earlier finding (e.g. the URL of a markdown image)
        merged.append((start, end, finding))
    return merged


def filter_output(text: str, *, egress: EgressPolicy | None = None) -> tuple[str, list[Finding]]:
    """Redact every finding in `text`: returns (redacted text, findings). Clean text is unchanged."""
    found = scan(text, egress=egress)
    if not found:
        return text, []
    out: list[str] = []
    last = 0
    for start, end, finding in found:
        out.append(text[last:start])
        out.append(f"[redacted {finding.kind.replace('_', ' ')}]")
        last = end
    out.append(text[last:])
    return "".join(out), [f for _, _, f in found]


def scan_values(values: Iterable[str], *, egress: EgressPolicy | None = None) -> list[Finding]:
    """Findings in several strings (e.g. a call's string arguments)."""
    return [f for v in values for _, _, f in scan(v, egress=egress)]


__all__ = ["Finding", "filter_output", "find_urls", "scan", "scan_values"]
