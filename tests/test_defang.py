"""Defanging (tether.values._defang) of the hosts a browser would still reach: bracketed IPv6 literals
in every form a URL writes them, numeric hosts in a URL's authority, host names with characters IDNA
drops; and the look-alikes that are not hosts (a time in brackets, a slice) left as they are."""

from __future__ import annotations

import pytest

from tether.values._defang import defang, has_link


@pytest.mark.parametrize(("text", "want"), [
    ("hxxp://[2001:db8::1]/x", "hxxp://[2001[:]db8[:][:]1]/x"),
    ("http://[2001:db8::1]/x", "hxxp://[2001[:]db8[:][:]1]/x"),
    ("https://[2001:db8::1]:8443/x", "hxxps://[2001[:]db8[:][:]1]:8443/x"),  # with a port
    ("http://[::ffff:203.0.113.7]/", "hxxp://[[:][:]ffff[:]203[.]0[.]113[.]7]/"),  # IPv4-mapped
    ("http://[::ffff:cb00:7107]/", "hxxp://[[:][:]ffff[:]cb00[:]7107]/"),
    ("http://[fe80::1%25eth0]/", "hxxp://[fe80[:][:]1%25eth0]/"),  # a zone id
    ("http://[::ffff:203\u30020\u3002113\u30027]/", "hxxp://[[:][:]ffff[:]203[.]0[.]113[.]7]/"),  # ideographic dots
    ("http://user@[2001:db8::1]/", "hxxp://user@[2001[:]db8[:][:]1]/"),
    ("reach [::1] or [2001:DB8:0:0:0:0:0:1]", "reach [[:][:]1] or [2001[:]DB8[:]0[:]0[:]0[:]0[:]0[:]1]"),
    ("http://0300.0250.0.1/", "hxxp://0300[.]0250[.]0[.]1/"),  # octal, short IPv4 forms
    ("http://u:p@10.1.1/", "hxxp://u:p@10[.]1[.]1/"),
    ("evil\u200b.com and e\u00advil.c\u200bom", "evil\u200b[.]com and e\u00advil[.]c\u200bom"),  # IDNA drops these
])
def test_hosts_a_browser_reaches_are_made_inert(text: str, want: str) -> None:
    assert defang(text) == want
    assert defang(want) == want and has_link(text)


@pytest.mark.parametrize("text", ["at [12:30:45] the log said", "arr[i:j:k] and [dead:beef]", "x = a // b",
                                  "Note: lunch at 12:30, pi is 3.14, e.g. v1.2; write to bob@home.example."])
def test_look_alikes_that_are_not_hosts_stay(text: str) -> None:
    assert defang(text) == text
