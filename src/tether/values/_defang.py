"""`defang`: the links and host names in untrusted text made inert before the text goes to a person.

`https://evil.example/x` becomes `hxxps://evil[.]example/x`, `javascript:alert(1)` `javascript[:]alert(1)`,
`203.0.113.7/reset` `203[.]0[.]113[.]7/reset`, `xn--80ak6aa92e.com` and `раура1.com` (IDN, punycode) get
the same `[.]`, as do the ideographic and full-width dots a browser reads as a dot. A bracketed IPv6
literal, as a URL writes its host, gets `[:]` for each colon: `hxxp://[2001[:]db8[:][:]1]/x`, and so does
an IPv6 address outside brackets (`2001[:]db8[:][:]1`). A host with no dot that is a number in any IPv4
form (`3232235521`, `0xC0A80001`, octal, percent-encoded or full-width digits) is written as the address it
stands for, inert (`hxxp://192[.]168[.]0[.]1/`); standing alone, only in forms prose does not write (hex,
octal, or followed by a path or a port). A reader sees where the
link pointed; no mail or chat client turns it into something to click. E-mail addresses are left as they
are (an address is text a person acts on by hand, like the rest of a message).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from urllib.parse import unquote

_DOT = r"[.\u3002\uff0e\uff61]"  # the dots IDNA reads as a label separator
_WEB = re.compile(r"\b(h)tt(ps?)(?=:|\[:\])", re.IGNORECASE)
_SCHEME = re.compile(r"\b([a-z][a-z0-9+.-]{1,31}):(?=//|[^\s\[]?)", re.IGNORECASE)
# a host name: labels of letters, digits and hyphens (any script) ending in a label of letters (or a
# punycode one), or an IPv4 address; not the domain of an e-mail address
_IGNORED = "\u00ad\u200b-\u200d\u2060\ufeff"  # soft hyphen, zero-width characters: IDNA drops them from a host
_HOST = re.compile(
    rf"(?<![\w@\-]){_DOT}?((?:[^\W_](?:[\w{_IGNORED}-]{{0,62}})?{_DOT}[{_IGNORED}]*)+(?:(?:[^\W\d_][{_IGNORED}]*){{2,63}}|xn--[\w-]+)"
    rf"|\d{{1,3}}(?:{_DOT}\d{{1,3}}){{3}})(?![\w-])",
)
# the host of a URL's authority (after `//`, past any user@), whatever its form: `0300.0250.0.1`, `127.1`
_AUTHORITY = re.compile(rf"//(?:[^/\s@\[\]]{{0,64}}@)?([\w-]+(?:{_DOT}[\w-]*)+)")
# a bracketed IPv6 literal, as a URL's host is written (`[2001:db8::1]`, `[::ffff:203.0.113.7]`, with a zone
# `[fe80::1%25eth0]`): hex digits, colons (two at least) and dots, after `//` or `@`, or elsewhere with a `::`
# or all eight groups (so `[12:30:45]` stays a time); its colons and dots are made inert
_IPV6 = re.compile(rf"(?:(?<=//)|(?<=@)|(?=\[[^\]\s]*::)|(?=\[(?:[^\]\s:]*:){{7}}))\[((?:[0-9A-Fa-f]|{_DOT})*:(?:[0-9A-Fa-f]|{_DOT})*:(?:[0-9A-Fa-f:]|{_DOT})*(?:%[\w.~%-]+)?)\]")
_LINK_SCHEMES = frozenset({"http", "https", "hxxp", "hxxps", "ftp", "ftps", "sftp", "ws", "wss", "file", "data",
                           "javascript", "vbscript", "blob", "smb", "ssh", "tel", "sms", "intent", "ms-settings"})


# the slashes a browser reads after a scheme (`http:\\host`, full-width ones folded by IDNA)
_SLASH = r"[/\\\uff0f\uff3c]"
# a host with no dot a URL names: after `//` (any slashes) and any user@, up to the port, path or end
_BARE_AUTHORITY = re.compile(rf"(?:{_SLASH}{{2}}(?:[^/\\\s@\[\]]{{0,64}}@)?|(?<=[\w.-])@)([\w%-]+(?:{_DOT}[\w%-]*)*)"
                             r"(?=[/\\?#:\s\uff0f\uff3c\uff1a]|$)")
# a number standing alone that curl (getaddrinfo, inet_aton) or a browser reads as an IPv4 address: one to
# four parts, decimal, octal (`0300`) or hex (`0xC0`); judged by `_loose_ipv4`
_NUMERIC = re.compile(rf"(?<![\w.@%:\[\]\-]|{_DOT})((?:0[xX][0-9A-Fa-f]*|\d+)(?:{_DOT}(?:0[xX][0-9A-Fa-f]*|\d+)){{0,3}})(?![\w\-\[\]]|{_DOT}\w)"
                      rf"(?=({_SLASH}|:\d)?)")
# an IPv6 address written without brackets (`2001:db8::1`, `::ffff:203.0.113.7`, `fe80::1%eth0`): checked by
# `ipaddress`, with a `::` or all eight groups, so `12:30:45` stays a time
_BARE_IPV6 = re.compile(r"(?<![\w:.\[%])((?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|\d{1,3}(?:\.\d{1,3}){3})?"
                        r"(?:%[\w.~-]+)?)(?![\w:\]])")


def _ipv4(token: str) -> str | None:
    """The dotted address a host (or a number) stands for, parsed as a browser (WHATWG) and inet_aton
    parse hosts: one to four parts, each decimal, octal (leading 0) or hex (0x), the last filling the
    remaining bytes (`3232235521`, `0xC0A80001`, `0300.0250.1`, `127.1`); None when it is no address."""
    text = unicodedata.normalize("NFKC", token).lower().replace("%2e", ".")
    parts = re.split(_DOT, text)
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # a trailing dot (the root) is still the address
    if not 1 <= len(parts) <= 4:
        return None
    nums: list[int] = []
    for p in parts:
        try:
            if p.startswith("0x"):
                nums.append(int(p[2:] or "0", 16))
            elif len(p) > 1 and p.startswith("0"):
                nums.append(int(p, 8))
            elif p.isdigit():
                nums.append(int(p))
            else:
                return None
        except ValueError:
            return None
    *head, last = nums
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(nums)):
        return None
    value = sum(n << (8 * (3 - i)) for i, n in enumerate(head)) + last
    return ".".join(str((value >> s) & 255) for s in (24, 16, 8, 0))


def _numeric(m: re.Match[str]) -> str:
    """A number alone that is an address in a form prose does not write: its dots made inert; with none,
    the address it stands for, dotted and inert. Such forms: a part in hex or octal, or three parts or more
    followed by a path or a port; one part (of at least 2**24: a fraction "24/7", `0x10` stay) in hex or
    octal, or followed by a path or a port."""
    token, tail = m.group(1), m.group(2)
    parts = re.split(_DOT, token)
    odd = any(p[:2].lower() == "0x" or (len(p) > 1 and p.startswith("0")) for p in parts)
    if (address := _ipv4(token)) is None:
        return token
    if len(parts) == 1:
        value = int(token, 16) if token[:2].lower() == "0x" else int(token, 8) if odd else int(token)
        if value < 1 << 24 or not (odd or tail):
            return token
        return address.replace(".", "[.]")
    if not (odd or (tail and len(parts) >= 3)):
        return token
    return re.sub(_DOT, "[.]", token)


def _bare_ipv6(m: re.Match[str]) -> str:
    text = m.group(1)
    address = text.split("%", 1)[0]
    if "::" not in address and address.count(":") != 7:
        return text
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return text
    return text.replace(".", "[.]").replace(":", "[:]")


def _bare_host(m: re.Match[str]) -> str:
    """A URL's host as a browser reads it: percent-escapes decoded (`evil%2Eexample` is evil.example), and
    with no dot, a number (any IPv4 form: `3232235521`, `0x7f000001`) is the address it stands for,
    written dotted and inert. The dots a host has are made inert after (`_AUTHORITY`)."""
    host = m.group(1)
    lead = m.group(0)[:m.start(1) - m.start(0)]
    if not re.search(_DOT, host) and (address := _ipv4(unquote(host))) is not None:
        return lead + address.replace(".", "[.]")
    return lead + re.sub("%2e", "[.]", host, flags=re.IGNORECASE)


def defang(text: str) -> str:
    """`text` with every link scheme and host name in it made inert (see the module docstring)."""
    out = _IPV6.sub(lambda m: "[" + re.sub(_DOT, "[.]", m.group(1)).replace(":", "[:]") + "]", text)
    if ":" in out:
        out = _BARE_IPV6.sub(_bare_ipv6, out)
    out = _BARE_AUTHORITY.sub(_bare_host, out)
    out = _NUMERIC.sub(_numeric, out)
    out = _AUTHORITY.sub(lambda m: m.group(0).replace(m.group(1), re.sub(_DOT, "[.]", m.group(1))), out)
    out = _HOST.sub(lambda m: m.group(0).replace(m.group(1), re.sub(_DOT, "[.]", m.group(1))), out)

    def scheme(m: re.Match[str]) -> str:
        name = m.group(1)
        if name.lower() in ("hxxp", "hxxps"):
            return m.group(0)  # already inert
        if name.lower() not in _LINK_SCHEMES and not m.string[m.end():].startswith("//"):
            return m.group(0)  # a word and a colon ("Note: ..."), not a link
        return f"{name}[:]"

    out = _WEB.sub(lambda m: f"{m.group(1)}xx{m.group(2)}", out)
    return _SCHEME.sub(scheme, out)


def has_link(text: str) -> bool:
    """Whether `text` holds anything `defang` would change."""
    return defang(text) != text
