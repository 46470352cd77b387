"""Chunking and loading: token windows with overlap, heading context, stable ids, file types."""

from __future__ import annotations

import pytest

pytest.importorskip("bm25s")

from tether.rag._chunking import chunk_id, chunk_sections, split_tokens
from tether.rag._loaders import Section, UnsupportedFile, load_file, parse_html, parse_markdown


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_windows_have_the_size_and_overlap_asked_for():
    pieces = split_tokens(words(25), size=10, overlap=3)
    assert [p.split()[0] for p in pieces] == ["w0", "w7", "w14", "w21"]
    assert [len(p.split()) for p in pieces] == [10, 10, 10, 4]
    # consecutive windows share exactly `overlap` tokens
    assert pieces[0].split()[-3:] == pieces[1].split()[:3]
    assert pieces[-1].split()[-1] == "w24"


def test_short_text_is_one_window_and_empty_text_none():
    assert split_tokens("just a few words", 10, 2) == ["just a few words"]
    assert split_tokens("   \n ", 10, 2) == []


def test_windows_keep_line_breaks_inside():
    assert split_tokens("a b\nc d", 10, 0) == ["a b\nc d"]


@pytest.mark.parametrize("size,overlap", [(0, 0), (5, 5), (5, -1)])
def test_bad_window_settings_are_refused(size, overlap):
    with pytest.raises(ValueError):
        split_tokens("a b c", size, overlap)


def test_markdown_sections_carry_their_heading_path():
    md = "intro text\n# Refunds\nMoney back.\n## After 30 days\nNo refunds.\n```\n# not a heading\n```\n# Shipping\nFast.\n"
    got = [(s.heading, s.text) for s in parse_markdown(md)]
    assert got == [
        ("", "intro text"),
        ("Refunds", "Money back."),
        ("Refunds > After 30 days", "No refunds.\n```\n# not a heading\n```"),
        ("Shipping", "Fast."),
    ]


def test_html_sections_drop_scripts_and_split_at_headings():
    html = ("<html><head><title>t</title><style>p{}</style></head><body><h1>Gift cards</h1><p>Valid 3 years.</p>"
            "<script>alert(1)</script><h2>Cash</h2><p>No cash&nbsp;back.</p></body></html>")
    got = [(s.heading, s.text) for s in parse_html(html)]
    assert got == [("Gift cards", "Valid 3 years."), ("Gift cards > Cash", "No cash\xa0back.")]


def test_chunks_keep_heading_as_context_and_never_span_sections():
    chunks = chunk_sections("doc.md", [Section("A", words(12)), Section("A > B", words(4, "x"))], size=10, overlap=2)
    assert [(c.position, c.heading, len(c.text.split())) for c in chunks] == [(0, "A", 10), (1, "A", 4), (2, "A > B", 4)]
    assert chunks[2].indexed_text.startswith("A > B\n")


def test_chunk_ids_are_stable_and_depend_on_source_position_and_content():
    a = chunk_sections("doc.md", [Section("H", "same text")])
    b = chunk_sections("doc.md", [Section("H", "same text")])
    assert a[0].id == b[0].id
    assert chunk_id("other.md", 0, "H", "same text") != a[0].id
    assert chunk_id("doc.md", 1, "H", "same text") != a[0].id
    assert chunk_id("doc.md", 0, "H", "changed text") != a[0].id


def _tiny_pdf(text: str) -> bytes:
    """A one-page PDF showing `text` in Helvetica (objects and xref written by hand)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def test_load_file_reads_markdown_text_html_and_pdf(tmp_path):
    (tmp_path / "a.md").write_text("# T\nbody")
    (tmp_path / "b.txt").write_text("plain words\n")
    (tmp_path / "c.html").write_text("<h1>H</h1><p>para</p>")
    (tmp_path / "d.pdf").write_bytes(_tiny_pdf("Refunds within thirty days"))
    assert [(s.heading, s.text) for s in load_file(tmp_path / "a.md")] == [("T", "body")]
    assert [(s.heading, s.text) for s in load_file(tmp_path / "b.txt")] == [("", "plain words")]
    assert [(s.heading, s.text) for s in load_file(tmp_path / "c.html")] == [("H", "para")]
    pdf = load_file(tmp_path / "d.pdf")
    assert [s.heading for s in pdf] == ["page 1"] and "Refunds within thirty days" in pdf[0].text


def test_unsupported_file_type_is_a_clear_error(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0\1")
    with pytest.raises(UnsupportedFile, match=r"unsupported file type \.bin"):
        load_file(tmp_path / "x.bin")
