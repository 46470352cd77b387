"""`defang`: the links and host names in untrusted text made inert before the text goes to a person.

`https://evil.example/x` becomes `hxxps://evil[.]example/x`, `javascript:alert(1)` `javascript[:]alert(1)`,
`203.0.113.7/reset` `203[.]0[.]113[.]7/reset`, `xn--80ak6aa92e.com` and `раура1.com` (IDN, punycode) get
the same `[.]`, as do the ideographic and full-width dots a browser reads as a dot. A bracketed IPv6
literal, as a URL writes its host, gets `[:]` for each colon: `hxxp://[2001[:]db8[:][:]1]/x`. A reader sees where the
link pointed; no mail or chat client turns it into something to click. E-mail addresses are left as they
are (an address is text a person acts on by hand, like the rest of a message).
"""

from __future__ import annotations

import re

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


def defang(text: str) -> str:
    """`text` with every link scheme and host name in it made inert (see the module docstring)."""
    out = _IPV6.sub(lambda m: "[" + re.sub(_DOT, "[.]", m.group(1)).replace(":", "[:]") + "]", text)
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
