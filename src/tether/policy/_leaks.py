"""Secret values: where they come from, and their exact spans in text leaving the run.

Sources, by what they are (not by a key's name): a file whose name says it holds secrets (`.env`,
key files, `.netrc`, ...; `secret_file`) read by any tool, the process environment
(`environment_secrets`), a tool declared `secret_output=True`. From such a source every
value is a secret whatever its key is called (`values_in`), if it is long and varied enough
(`is_secret_value`). Any tool output's secret-*looking* values (`secrets_in`, by pattern) count too.

Finding them again is exact matching, not guessing: each value's encodings are computed
(`encodings`: base64 and base32 at every alignment, hex, rot13, URL-encoding, character codes,
spaced-out characters, each of the value and of its reverse) and searched for in a skeleton of the
text (NFKC, invisible characters and whitespace removed, lower-cased) that maps back to the text's
own characters, so `redact` replaces just those spans and keeps the rest.
"""

from __future__ import annotations

import base64
import codecs
import functools
import os
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from tether.policy._output_filter import ANY_SECRET, SECRET_PATTERNS, SHORT_TEXT, secret_patterns_for

# 8+ characters: shorter values (`true`, `1`, `8080`, `admin`) are too common to hunt for, and their
# encodings too short to match exactly. Under 16 characters a value must also have a run of letters
# and digits that mixes kinds (lower, upper, digit): words and numbers joined by punctuation
# (`localhost`, `production`, `eu-west-1`, `db.internal:5432`) are settings, `hunter2!`,
# `pG7-pass-99` and `Wq8vL2nZ` are secrets. From 16 characters on, any value is.
MIN_SECRET = 8
PLAIN_WORD_MAX = 16
_ALNUM_RUN = re.compile(r"[^\W_]+")
_INVISIBLE = {"Cf", "Cc", "Zl", "Zp", "Co", "Cs", "Cn"}  # format (zero-width, bidi, tags), control, ...
# the value of "password: X", "the API key is X": the last token of the match
_VALUE = re.compile(r"(?:[:=]|\bis\b|\bwas\b)\s*[\"'`]?([^\s\"'`,;]+)\s*$", re.IGNORECASE)


# ASCII's invisible characters (all category Cc) but newline and tab, deleted by str.translate
_ASCII_INVISIBLE = dict.fromkeys(c for c in range(128) if unicodedata.category(chr(c)) in _INVISIBLE and chr(c) not in "\n\t")


def normalise(text: str) -> str:
    """NFKC (fullwidth and other compatibility forms to plain), invisible characters removed."""
    if text.isascii():  # NFKC keeps ASCII as it is: only its control characters go (one C call)
        return text.translate(_ASCII_INVISIBLE)
    text = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in text if unicodedata.category(ch) not in _INVISIBLE or ch in "\n\t")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def secrets_in(text: str) -> set[str]:
    """The secret-looking values in a text, by pattern (whitespace inside them removed)."""
    out: set[str] = set()
    plain = text.translate(_ASCII_INVISIBLE) if text.isascii() else normalise(text)  # (`normalise`'s ASCII case)
    if len(plain) <= SHORT_TEXT:  # `secret_patterns_for`'s short case, without its frame
        patterns = SECRET_PATTERNS if ANY_SECRET.search(plain) is not None else ()
    else:
        patterns = secret_patterns_for(plain)
    for label, pattern in patterns:
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


# -- sources ----------------------------------------------------------------------------------------

# Files that hold secrets, by name. Templates (`.env.example`, `.env.sample`, ...) hold placeholders;
# public keys (`id_rsa.pub`) and certificates are public.
_SECRET_NAMES = re.compile(
    r"(?i)^(?:\.env(?:\.(?!(?:example|sample|template|dist|defaults?)$)[\w.-]+)?|[\w.-]+\.env|"
    r"[\w.-]+\.(?:pem|key|p12|pfx|kdbx|keystore|jks)|id_(?:rsa|dsa|ecdsa|ed25519)(?:_[\w-]+)?|"
    r"\.netrc|_netrc|\.pgpass|\.my\.cnf|\.npmrc|\.pypirc|\.git-credentials|\.htpasswd|\.dockercfg|"
    r"credentials(?:\.json|\.ya?ml|\.toml|\.ini)?|secrets?(?:\.json|\.ya?ml|\.toml|\.ini|\.txt)?|"
    r"[\w.-]*[._-](?:token|api_?key|password|passwd)(?:\.txt)?|(?:token|api_?key|password|passwd)\.txt)$")
_PUBLIC = re.compile(r"(?i)\.(?:pub|crt|cer|csr)$")


def secret_file(path: str) -> str | None:
    """The file's name if it says the file holds secrets (`.env`, `prod.env`, `id_rsa`, `server.key`,
    `.netrc`, `.pgpass`, `credentials`, `secrets.yaml`, `*.kdbx`, ...), else None."""
    name = PurePosixPath(path.strip().replace("\\", "/")).name
    if not name or _PUBLIC.search(name) or not _SECRET_NAMES.match(name):
        return None
    return name


def is_secret_value(value: str) -> bool:
    """Long and varied enough to be a secret rather than a common setting (see MIN_SECRET)."""
    if len(value) < MIN_SECRET:
        return False
    if len(value) >= PLAIN_WORD_MAX:
        return True
    for run in _ALNUM_RUN.findall(value):
        kinds = any(c.islower() for c in run) + any(c.isupper() for c in run) + any(c.isdigit() for c in run)
        if kinds >= 2:
            return True
    return False


_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----([\s\S]*?)-----END \1-----")
_ASSIGN = re.compile(r"""^\s*(?:export\s+|set\s+)?["']?[\w.\-\[\]/@ ]{1,80}?["']?\s*(?:=|:(?!//))\s*(.*?)\s*,?\s*$""")
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:([^/\s@]+)@", re.IGNORECASE)
_NETRC_KEYS = {"login", "password", "account"}
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
        return value[1:-1]
    return re.sub(r"\s+#.*$", "", value)  # an unquoted value's inline comment


def values_in(text: str, name: str = "") -> list[str]:
    """Every value a secret-bearing text holds, whatever its key: the right-hand side of each
    assignment (dotenv, ini, yaml, JSON lines), `.netrc` login/password/account words, a `.pgpass`
    line's password, a private key's body, a URL's password; in a file of bare lines (a token file),
    each line. Only values `is_secret_value` accepts."""
    found: list[str] = []
    lower = name.lower()
    for m in _PEM.finditer(text):
        if "PRIVATE" in m.group(1) or ("PUBLIC" not in m.group(1) and "CERTIFICATE" not in m.group(1)):
            body = "".join(line for line in m.group(2).splitlines() if ":" not in line)
            found.append(_squash(body))
    rest = _PEM.sub("\n", text)
    if lower in (".netrc", "_netrc"):
        words = rest.split()
        found += [words[i + 1] for i, w in enumerate(words[:-1]) if w in _NETRC_KEYS]
    bare: list[str] = []
    for line in rest.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[" or line.startswith("//"):
            continue
        if lower == ".pgpass" and line.count(":") >= 4:
            found.append(line.rsplit(":", 1)[1])
            continue
        m = _ASSIGN.match(line)
        if m is not None:
            found.append(_unquote(m.group(1).strip()))
        elif lower not in (".netrc", "_netrc"):
            bare.append(line)
    if not found:  # a whole-secret file: its content, line by line
        found = bare
    found += [m.group(1) for v in list(found) for m in _URL_PASSWORD.finditer(v)]
    return list(dict.fromkeys(v for v in found if is_secret_value(v)))


# Variables every process has, public by definition; any other environment value is a secret.
_PUBLIC_ENV = re.compile(
    r"^(?:PATH|HOME|PWD|OLDPWD|SHELL|SHLVL|USER|USERNAME|LOGNAME|HOSTNAME|HOST|LANG|LANGUAGE|LC_\w+|TERM|"
    r"TERM_\w+|COLORTERM|TZ|TMPDIR|TEMP|TMP|DISPLAY|EDITOR|VISUAL|PAGER|MAIL|_|PS[1-4]|XDG_\w+|"
    r"VIRTUAL_ENV|CONDA_\w+|PYTHON\w*|PYTEST_\w+|PIP_\w+|DEBIAN_FRONTEND|CI|SSH_TTY|MANPATH|INFOPATH)$")


# the last environment read and its secrets: (a copy of its raw mapping, the secrets). A run reads the
# same environment at every scan and at its end; a copy compared whole (one C dict comparison, no
# decoding) says it is the same, so the secrets are exactly those it would give.
_env_seen: tuple[dict[Any, Any], list[str]] | None = None


def environment_secrets(environ: Mapping[str, str]) -> list[str]:
    """The process environment's values that count as secrets: all but the public variables above,
    values that are file-system paths (a CA bundle's location is no secret) and URLs (an endpoint's
    address is no secret: OPENAI_BASE_URL; the password inside one, `postgres://u:PASS@h/db`, is)."""
    global _env_seen
    if isinstance(environ, os._Environ):  # its own store, raw (its items are decoded one by one)
        raw: dict[Any, Any] = environ._data  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]
    elif type(environ) is dict:
        raw = environ
    else:
        return _environment_secrets(environ)
    seen = _env_seen
    if seen is not None and seen[0] == raw:
        return list(seen[1])
    snapshot = dict(raw)  # the secrets are those of this copy (the environment may change meanwhile)
    if isinstance(environ, os._Environ):
        found = _environment_secrets({environ.decodekey(k): environ.decodevalue(v) for k, v in snapshot.items()})
    else:
        found = _environment_secrets(snapshot)
    _env_seen = (snapshot, found)
    return list(found)


def _environment_secrets(environ: Mapping[str, str]) -> list[str]:
    out = []
    for key, value in environ.items():
        if _PUBLIC_ENV.match(key) or not is_secret_value(value):
            continue
        if all(part.startswith(("/", "~")) for part in value.split(os.pathsep) if part):
            continue
        if _URL.fullmatch(value.strip()) and "?" not in value and "#" not in value:
            # an address (a base URL) is no secret; the password inside one is, and a URL with a query
            # (`?key=...`) stays a secret whole
            out += [m.group(1) for m in _URL_PASSWORD.finditer(value) if is_secret_value(m.group(1))]
            continue
        out.append(value)
    return out


# -- finding them again -------------------------------------------------------------------------------


def _key(text: str) -> str:
    """A needle or a text as the skeleton holds it: NFKC, no invisible characters or whitespace, lower."""
    out = []
    for ch in unicodedata.normalize("NFKC", text):
        if ch.isspace() or unicodedata.category(ch) in _INVISIBLE:
            continue
        low = ch.lower()
        out.append(low if len(low) == 1 else ch)
    return "".join(out)


def _cores(raw: bytes, bits: int, encode: Callable[[bytes], bytes]) -> list[str]:
    """The characters of `raw`'s encoding that depend on its bytes alone, at every alignment it can
    have inside a longer encoded text (base64: 3, base32: 5)."""
    group = 3 if bits == 6 else 5
    out = []
    for k in range(group):
        enc = encode(b"\0" * k + raw).decode("ascii")
        start = -(-8 * k // bits)
        end = (8 * k + 8 * len(raw)) // bits
        out.append(enc[start:end])
    return out


_CODE_SEPARATORS = (",", ";", ".", "-", "|", "/", ":", "_", "")
_SPACERS = (".", "-", "_", ",", "|", "/", "*", ":", ";", "+", "·", "•", "")


def _forms(value: str) -> list[tuple[str, str]]:
    """(encoded text, how) for one string."""
    raw = value.encode("utf-8")
    out = [(value, "as written"), (base64.b64encode(raw).decode(), "base64"),
           (base64.urlsafe_b64encode(raw).decode(), "base64"), (base64.b32encode(raw).decode(), "base32"),
           (raw.hex(), "hex"), (codecs.encode(value, "rot13"), "rot13"),
           (urllib.parse.quote(value, safe=""), "URL-encoded"), ("".join(f"%{b:02x}" for b in raw), "URL-encoded")]
    out += [(c, "base64") for c in _cores(raw, 6, base64.b64encode) + _cores(raw, 6, base64.urlsafe_b64encode)]
    out += [(c, "base32") for c in _cores(raw, 5, base64.b32encode)]
    codes = [str(ord(c)) for c in value]
    out += [(sep.join(codes), "character codes") for sep in _CODE_SEPARATORS]
    out += [(sep.join(f"0x{b:02x}" for b in raw), "character codes") for sep in (",", ";", "")]
    out += [(sep.join(f"{b:02x}" for b in raw), "hex") for sep in (":", "-", ",")]
    out += [("".join(f"{pre}{b:02x}" for b in raw), "character codes") for pre in ("\\x", "\\u00", "&#x")]
    out += [("".join(f"&#{ord(c)};" for c in value), "character codes")]
    out += [(sep.join(value), "spaced out") for sep in _SPACERS if sep]
    return out


@functools.lru_cache(maxsize=4096)
def encodings(value: str) -> tuple[tuple[str, str], ...]:
    """Every supported encoding of `value` and of its reverse, as skeleton keys: (key, how)."""
    out: dict[str, str] = {}
    for form, prefix in ((value, ""), (value[::-1], "reversed")):
        for text, how in _forms(form):
            key = _key(text)
            if len(key) >= MIN_SECRET and key not in out:
                label = how if not prefix else "reversed" if how == "as written" else f"{how} of it reversed"
                out[key] = label
    return tuple(sorted(out.items(), key=lambda kv: -len(kv[0])))


def _skeleton(text: str) -> tuple[str, list[int]]:
    """The text as `_key` makes it, and for each of its characters the index of the text's character."""
    if text.isascii():  # the usual case, 5x faster: NFKC keeps ASCII, whitespace and controls are <= " "
        where = [i for i, c in enumerate(text) if " " < c != "\x7f"]
        return "".join([text[i] for i in where]).lower(), where
    chars: list[str] = []
    where: list[int] = []
    for i, ch in enumerate(text):
        for c in unicodedata.normalize("NFKC", ch):
            if c.isspace() or unicodedata.category(c) in _INVISIBLE:
                continue
            low = c.lower()
            chars.append(low if len(low) == 1 else c)
            where.append(i)
    return "".join(chars), where


@dataclass(frozen=True, slots=True)
class Leak:
    """A span of text that is a known secret value, or an exact encoding of one."""

    start: int
    end: int
    source: str  # where the value was read: ".env", "the environment", a tool's name
    how: str  # "as written", "base64", "rot13 of it reversed", ...


def find_leaks(text: str, secrets: Mapping[str, str]) -> list[Leak]:
    """The spans of `text` that hold a value of `secrets` (value -> source) or an encoding of one, in
    order; overlapping spans are merged (the first's source and encoding named)."""
    if not secrets or not text:
        return []
    skel, where = _skeleton(text)
    # every needle is MIN_SECRET+ long: one whose first MIN_SECRET characters are nowhere in the text
    # is passed over without a search (a set lookup instead of a scan of the text)
    grams = {skel[i:i + MIN_SECRET] for i in range(len(skel) - MIN_SECRET + 1)}
    spans: list[Leak] = []
    for value, source in secrets.items():
        if len(value) < MIN_SECRET:
            continue
        for key, how in encodings(value):
            if key[:MIN_SECRET] not in grams:
                continue
            at = skel.find(key)
            while at != -1:
                spans.append(Leak(where[at], where[at + len(key) - 1] + 1, source, how))
                at = skel.find(key, at + 1)
    spans.sort(key=lambda s: (s.start, -s.end))
    merged: list[Leak] = []
    for span in spans:
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            if span.end > last.end:
                merged[-1] = Leak(last.start, span.end, last.source, last.how)
            continue
        merged.append(span)
    return merged


def redact(text: str, secrets: Mapping[str, str]) -> tuple[str, list[Leak]]:
    """`text` with each secret span replaced by `[secret from <source> redacted]`; the rest unchanged."""
    leaks = find_leaks(text, secrets)
    if not leaks:
        return text, []
    out: list[str] = []
    last = 0
    for leak in leaks:
        out += [text[last:leak.start], f"[secret from {leak.source} redacted]"]
        last = leak.end
    out.append(text[last:])
    return "".join(out), leaks


def leaked_in(answer: str, secrets: Iterable[str]) -> list[str]:
    """How each known secret appears in the answer (e.g. "base64"), one entry per span found."""
    return [leak.how for leak in find_leaks(answer, dict.fromkeys(secrets, ""))]
