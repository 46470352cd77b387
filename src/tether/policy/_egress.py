"""Egress: which hosts fetching and posting tools may reach, and what counts as internal."""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from tether._errors import InvalidInput

URL_RE = re.compile(r"""(?:https?://|www\.)[^\s<>"'`)\]]+""", re.IGNORECASE)
_INTERNAL_SUFFIXES = (".internal", ".local", ".localhost", ".corp", ".lan", ".intranet", ".home.arpa")


def ascii_lower(text: str) -> str:
    """Lower-case ASCII letters only. Unicode case mapping would make different hosts equal (the
    Kelvin sign lower-cases to "k", and casefolding makes "straße" "strasse"): a host is compared as
    written, so a look-alike never matches an allowlisted name."""
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def host_of(url: str) -> str:
    """The host of a URL, ASCII-lower-cased; scheme-less URLs (`www.x.com/a`) are read as http."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    try:
        split = urlsplit(url)
        split.port  # noqa: B018  (raises ValueError on a malformed port, as .hostname would)
        netloc = split.netloc.rpartition("@")[2]  # not .hostname: it lower-cases with Unicode rules
    except ValueError:
        return ""
    host = netloc[1:netloc.index("]")] if netloc.startswith("[") and "]" in netloc else netloc.partition(":")[0]
    return ascii_lower(host).rstrip(".")


def is_internal(host: str) -> bool:
    """Loopback, private, link-local (cloud metadata) and reserved addresses, and internal names."""
    host = ascii_lower(host).strip("[]")
    if not host:
        return False
    if host == "localhost" or host.endswith(_INTERNAL_SUFFIXES) or "." not in host:
        return True
    ip = _ip(host)
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_unspecified
            or ip in _SHARED)


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not public, not in is_private on 3.11
_NUMERIC_HOST = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}", re.IGNORECASE)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names, including the forms resolvers accept besides dotted quads
    (`127.1`, `0177.0.0.1`, `0x7f000001`, `2130706433` all reach 127.0.0.1)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


# Top-level domains a bare host name is recognised by ("true-informations.com", "evil.io/x?d=1").
# File extensions that are also country domains (.py, .sh, .md, .rs, .pl, .ts...) are left out, so
# "main.py" stays a file name; those hosts are still caught with a scheme or "www.".
TLDS = frozenset(["com", "net", "org", "info", "biz", "io", "ai", "co", "app", "dev", "xyz", "me", "tv", "us", "uk", "de", "fr", "es", "it", "nl", "be", "ch", "at", "se", "no", "dk", "fi", "pl", "ru", "cn", "jp", "kr", "in", "br", "au", "ca", "mx", "ar", "cl", "eu", "asia", "online", "site", "website", "shop", "store", "tech", "cloud", "live", "news", "blog", "page", "link", "click", "top", "club", "email", "one", "pro", "gov", "edu", "mil", "int", "name", "mobi", "ly", "gg", "cc", "ws", "to", "fm", "ms", "la", "su", "ua", "cz", "gr", "pt", "ro", "hu", "ie", "il", "tr", "za", "ng", "ke", "sg", "hk", "tw", "vn", "id", "th", "my", "ph", "nz", "is", "lt", "lv", "ee", "sk", "si", "hr", "bg", "rs", "ir", "pk", "bd", "eg", "sa", "ae", "qa"]) - {"rs", "sh", "md", "py", "pl", "ts", "js", "cs", "ps", "so"}
_HOST_RE = re.compile(
    r"(?<![\w@.\-/])((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+([a-z]{2,24}))(?::\d{1,5})?(?:[/?#][^\s<>\"'`)\]]*)?"
    r"(?![\w@\-])", re.IGNORECASE)


def find_hosts(text: str) -> list[str]:
    """Bare host names with a known top-level domain, and what follows them as a URL
    ("evil.com/?d=1"); e-mail addresses are not hosts."""
    out = []
    for m in _HOST_RE.finditer(text):
        if m.group(2).lower() in TLDS:
            out.append(m.group().rstrip(".,;:!?"))
    return out


def find_urls(text: str) -> list[str]:
    """URLs with a scheme or `www.`, and bare host names (`evil.com/x?d=1`), in order, not overlapping."""
    urls = [(m.start(), m.group().rstrip(".,;:!?")) for m in URL_RE.finditer(text)]
    taken = [(start, start + len(u)) for start, u in urls]
    for m in _HOST_RE.finditer(text):
        if m.group(2).lower() in TLDS and not any(a <= m.start() < b for a, b in taken):
            urls.append((m.start(), m.group().rstrip(".,;:!?")))
    return [u for _, u in sorted(urls)]


def looks_like_url(value: str) -> bool:
    """The whole value is a URL or a bare host name (what a tool would fetch or post to)."""
    v = value.strip()
    if not v or any(c.isspace() for c in v):
        return False
    if URL_RE.fullmatch(v):
        return True
    m = _HOST_RE.fullmatch(v)
    return bool(m and m.group(2).lower() in TLDS)


@functools.cache
def _public_suffixes() -> Any:
    from publicsuffixlist import PublicSuffixList  # the list ships inside the package: no network

    return PublicSuffixList()


@functools.cache
def _known_suffixes() -> Any:
    from publicsuffixlist import PublicSuffixList

    return PublicSuffixList(accept_unknown=False)  # an unlisted label is no top-level domain


def is_tld(label: str) -> bool:
    """Whether `label` is a top-level domain on the Public Suffix List (`com`, `it`, `shop`; not `they`)."""
    return "." not in label and bool(_known_suffixes().is_public(ascii_lower(label)))


# a host, a period, then a capitalised word not glued to more host characters: "www.x.com.They"
_SENTENCE_END = re.compile(r"(?<![\w@.\-])((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+([a-z]{2,24}))\.([A-Z][a-z]*)"
                           r"(?![\w@.\-/])", re.IGNORECASE)


def split_sentence_ends(text: str) -> str:
    """`text` with a space after a host that ends a sentence with no space before the next one
    ("visit www.x.com.They said" -> "www.x.com. They"), as a reader reads it. Only when the host's
    last label is a top-level domain and the next word is not one (by the Public Suffix List): in
    "www.x.com.It" the host may be www.x.com.it, so nothing is split (reading fewer hosts as the
    user's is the safe side)."""
    def split(m: re.Match[str]) -> str:
        word = m.group(3)
        capitalised = word[0].isupper() and (len(word) == 1 or word[1:].islower())
        if not capitalised or not is_tld(m.group(2)) or is_tld(word):
            return m.group()
        return f"{m.group(1)}. {word}"

    return _SENTENCE_END.sub(split, text) if "." in text else text


def is_public_suffix(domain: str) -> bool:
    """Whether anyone may register names under `domain` (`com`, `co.uk`, `github.io`), by the Public
    Suffix List (ICANN and private sections)."""
    return bool(_public_suffixes().is_public(domain))


class EgressPolicy:
    """A host allowlist. `"example.com"` matches exactly, `"*.example.com"` any subdomain (and the
    domain itself). Internal hosts are refused unless listed explicitly. A wildcard over a public
    suffix (`"*.github.io"`, `"*.co.uk"`) is refused: every site anyone registers there would match."""

    def __init__(self, allow: Iterable[str] = ()) -> None:
        self.exact: set[str] = set()
        self.suffixes: list[str] = []
        for pattern in allow:
            p = ascii_lower(pattern).strip()
            if p.startswith("*."):
                if is_public_suffix(p[2:]):
                    raise InvalidInput(f"egress allowlist entry '{pattern}' covers every site registered under "
                                       f"the public suffix '{p[2:]}' (anyone can have one): list exact hosts, or "
                                       f"a wildcard under a registrable domain ('*.yourname.{p[2:]}')")
                self.suffixes.append(p[2:])
            elif p:
                self.exact.add(p)

    def allows_host(self, host: str) -> bool:
        host = ascii_lower(host)
        if host in self.exact:
            return True
        return any(host == s or host.endswith("." + s) for s in self.suffixes)

    def check(self, url: str) -> tuple[str, str]:
        """`("allow" | "internal" | "unlisted", reason)` for one URL."""
        host = host_of(url)
        if not host:
            return "internal", f"'{url}' is not a URL with a host"
        if self.allows_host(host):
            return "allow", ""
        if is_internal(host):
            return "internal", f"'{host}' is an internal address"
        return "unlisted", f"'{host}' is not on the egress allowlist"
