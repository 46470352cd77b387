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


@pytest.mark.parametrize(("text", "want"), [
    # a host with no dot: any IPv4 form a browser or curl (inet_aton) reads becomes the address, inert
    ("hxxp://3232235521/", "hxxp://192[.]168[.]0[.]1/"),
    ("http://3232235521:8080/x", "hxxp://192[.]168[.]0[.]1:8080/x"),
    ("http://0xC0A80001/", "hxxp://192[.]168[.]0[.]1/"),
    ("http://017700000001/", "hxxp://127[.]0[.]0[.]1/"),  # octal
    ("http://user@3232235521/", "hxxp://user@192[.]168[.]0[.]1/"),
    ("http://%33%32%33%32235521/", "hxxp://192[.]168[.]0[.]1/"),  # percent-encoded digits
    ("http://\uff13\uff12\uff13\uff12\uff12\uff13\uff15\uff15\uff12\uff11/", "hxxp://192[.]168[.]0[.]1/"),  # full-width
    ("http:\\\\3232235521\\x", "hxxp:\\\\192[.]168[.]0[.]1\\x"),  # backslashes, as a browser reads them
    ("http://evil%2Eexample/", "hxxp://evil[.]example/"),  # a percent-encoded dot
    # standing alone, in forms prose does not write
    ("see 0xC0A80001 now", "see 192[.]168[.]0[.]1 now"),
    ("017700000001", "127[.]0[.]0[.]1"),
    ("3232235521/reset", "192[.]168[.]0[.]1/reset"),
    ("curl 0xc0.0xa8.0.1", "curl 0xc0[.]0xa8[.]0[.]1"),  # mixed hex and decimal parts
    ("192.168.1/admin", "192[.]168[.]1/admin"),
    # IPv6 without brackets
    ("go to 2001:db8::1 now", "go to 2001[:]db8[:][:]1 now"),
    ("http://2001:db8::1/", "hxxp://2001[:]db8[:][:]1/"),
    ("::ffff:203.0.113.7", "[:][:]ffff[:]203[.]0[.]113[.]7"),
    ("fe80::1%eth0", "fe80[:][:]1%eth0"),
    ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001[:]0db8[:]0000[:]0000[:]0000[:]0000[:]0000[:]0001"),
])
def test_hosts_with_no_dot_and_bare_ipv6_are_made_inert(text: str, want: str) -> None:
    assert defang(text) == want
    assert defang(want) == want and has_link(text)


@pytest.mark.parametrize("text", ["order 1234567890 shipped", "3232235521", "24/7 and 3/4, page 10/20", "x = 0x10",
                                  "at 09:30 / 10:00", "std::vector and 12:30:45", "1.5/2 cups", "ratio 127.1"])
def test_numbers_that_are_not_hosts_stay(text: str) -> None:
    assert defang(text) == text
