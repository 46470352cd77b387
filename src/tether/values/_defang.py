"""`defang`: the links and host names in untrusted text made inert before the text goes to a person.

`https://evil.example/x` becomes `hxxps://evil[.]example/x`, `javascript:alert(1)` `javascript[:]alert(1)`,
`203.0.113.7/reset` `203[.]0[.]113[.]7/reset`, `xn--80ak6aa92e.com` and `раура1.com` (IDN, punycode) get
the same `[.]`, as do the ideographic and full-width dots a browser reads as a dot. A reader sees where the
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
_HOST = re.compile(
    rf"(?<![\w@\-]){_DOT}?((?:[^\W_](?:[\w-]{{0,62}})?{_DOT})+(?:[^\W\d_]{{2,63}}|xn--[\w-]+)|\d{{1,3}}(?:{_DOT}\d{{1,3}}){{3}})"
    r"(?![\w-])",
)
_LINK_SCHEMES = frozenset({"http", "https", "hxxp", "hxxps", "ftp", "ftps", "sftp", "ws", "wss", "file", "data",
                           "javascript", "vbscript", "blob", "smb", "ssh", "tel", "sms", "intent", "ms-settings"})


def defang(text: str) -> str:
    """`text` with every link scheme and host name in it made inert (see the module docstring)."""
    out = _HOST.sub(lambda m: m.group(0).replace(m.group(1), re.sub(_DOT, "[.]", m.group(1))), text)

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
