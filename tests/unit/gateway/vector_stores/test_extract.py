"""Upload kinds and text extraction: plain text, Markdown, HTML, PDF (real PDFs built in the test)."""

from __future__ import annotations

import pytest

from gateway.vector_stores.extract import Kind, UnsupportedFile, clean_filename, detect, extract, html_text
from tests.fixtures.documents import make_pdf

LIMITS = {"max_chars": 100_000, "max_pages": 10}


@pytest.mark.parametrize(
    ("name", "content_type", "kind"),
    [
        ("notes.txt", "text/plain", Kind.TEXT),
        ("README.md", "text/markdown", Kind.MARKDOWN),
        ("README.md", "text/plain", Kind.MARKDOWN),
        ("README.md", "application/octet-stream", Kind.MARKDOWN),
        ("page.HTML", None, Kind.HTML),
        ("page.htm", "text/html; charset=utf-8", Kind.HTML),
        ("report.pdf", "application/pdf", Kind.PDF),
        ("report.pdf", "application/octet-stream", Kind.PDF),
        ("no-extension", "application/pdf", Kind.PDF),
        ("no-extension", "text/markdown", Kind.MARKDOWN),
    ],
)
def test_detect(name: str, content_type: str | None, kind: Kind) -> None:
    assert detect(name, content_type) is kind


@pytest.mark.parametrize(
    ("name", "content_type", "words"),
    [
        ("photo.png", "image/png", "unsupported file type"),
        ("archive", "application/zip", "unsupported file type"),
        ("report.pdf", "text/html", "the content type 'text/html'"),
        ("page.html", "application/pdf", "(html) but the content type 'application/pdf' (pdf)"),
        ("notes.txt", "image/png", "the content type 'image/png'"),
    ],
)
def test_detect_refuses_naming_the_problem(name: str, content_type: str, words: str) -> None:
    with pytest.raises(UnsupportedFile, match=r"^file: ") as caught:
        detect(name, content_type)
    assert words in caught.value.message
    if "unsupported" in words:
        assert ".pdf" in caught.value.message  # the supported kinds are listed


def test_clean_filename_drops_directories() -> None:
    assert clean_filename("C:\\docs\\a.txt") == "a.txt"
    assert clean_filename("../../etc/passwd.md") == "passwd.md"
    with pytest.raises(UnsupportedFile.__mro__[1], match="no file name"):
        clean_filename("dir/")


def test_text_and_markdown_are_utf8() -> None:
    assert extract("\ufeffHéllo\n".encode(), Kind.TEXT, **LIMITS).text == "Héllo\n"
    assert extract(b"# Title\n\nBody", Kind.MARKDOWN, **LIMITS).text == "# Title\n\nBody"
    with pytest.raises(UnsupportedFile, match="not UTF-8 text"):
        extract(b"caf\xe9", Kind.TEXT, **LIMITS)
    with pytest.raises(UnsupportedFile, match="NUL"):
        extract(b"a\x00b", Kind.TEXT, **LIMITS)
    with pytest.raises(UnsupportedFile, match="no text"):
        extract(b" \n\t ", Kind.MARKDOWN, **LIMITS)
    with pytest.raises(UnsupportedFile, match="over the limit of 10"):
        extract(b"x" * 11, Kind.TEXT, max_chars=10, max_pages=1)


def test_html_keeps_visible_text_in_paragraphs() -> None:
    markup = """<!doctype html><html><head><title>Guide</title><style>p {color: red}</style>
    <script>var secret = "hidden";</script></head>
    <body><h1>Returns &amp; refunds</h1><p>Boots can be returned
    within <b>30</b>&nbsp;days.</p><ul><li>one</li><li>two</li></ul>line<br>break</body></html>"""
    text = html_text(markup)
    assert "secret" not in text and "color" not in text and "<" not in text
    assert "Returns & refunds\n\nBoots can be returned within 30\xa0days." in text
    assert "one\n\ntwo" in text
    assert text.startswith("Guide")
    assert "line\nbreak" in text


def test_pdf_text_per_page() -> None:
    data = make_pdf(["First page (intro).\nIt has two lines.", "Second page about llamas."])
    extracted = extract(data, Kind.PDF, **LIMITS)
    assert extracted.pages == 2
    assert extracted.text == "First page (intro).\nIt has two lines.\n\nSecond page about llamas."


def test_pdf_refusals() -> None:
    with pytest.raises(UnsupportedFile, match="not a PDF"):
        extract(b"<html>nope</html>", Kind.PDF, **LIMITS)
    with pytest.raises(UnsupportedFile, match="cannot be read"):
        extract(b"%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage", Kind.PDF, **LIMITS)
    with pytest.raises(UnsupportedFile, match="3 pages, over the limit of 2"):
        extract(make_pdf(["a", "b", "c"]), Kind.PDF, max_chars=1000, max_pages=2)
    with pytest.raises(UnsupportedFile, match="no extractable text"):
        extract(make_pdf([""]), Kind.PDF, **LIMITS)
    with pytest.raises(UnsupportedFile, match="more than 20 characters"):
        extract(make_pdf(["x" * 30]), Kind.PDF, max_chars=20, max_pages=5)
