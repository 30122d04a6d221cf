"""What an uploaded file is, and its text: plain text, Markdown, HTML (tags stripped), PDF.

The kind comes from the file name's extension and the part's content type; the two must
agree (a generic content type such as ``application/octet-stream`` defers to the
extension). Every refusal is an :class:`UnsupportedFile` (400) naming the problem. PDF
text comes from pypdf (pure Python, its own decompression limits); scanned pages, which
have no text layer, give no text.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from enum import StrEnum
from html.parser import HTMLParser

from services.runtime.errors import InvalidArgument


class UnsupportedFile(InvalidArgument):
    """The file's type is not one the mesh reads, or its content is not what its type says."""


class Kind(StrEnum):
    TEXT = "text"
    MARKDOWN = "markdown"
    HTML = "html"
    PDF = "pdf"


EXTENSIONS: dict[str, Kind] = {
    ".txt": Kind.TEXT,
    ".text": Kind.TEXT,
    ".md": Kind.MARKDOWN,
    ".markdown": Kind.MARKDOWN,
    ".html": Kind.HTML,
    ".htm": Kind.HTML,
    ".pdf": Kind.PDF,
}
CONTENT_TYPES: dict[str, Kind] = {
    "text/plain": Kind.TEXT,
    "text/markdown": Kind.MARKDOWN,
    "text/x-markdown": Kind.MARKDOWN,
    "text/html": Kind.HTML,
    "application/xhtml+xml": Kind.HTML,
    "application/pdf": Kind.PDF,
}
# Content types that say nothing about the file: the extension decides.
GENERIC_TYPES = frozenset({"", "application/octet-stream", "binary/octet-stream", "application/x-download"})
MEDIA_TYPES: dict[Kind, str] = {
    Kind.TEXT: "text/plain; charset=utf-8",
    Kind.MARKDOWN: "text/markdown; charset=utf-8",
    Kind.HTML: "text/html; charset=utf-8",
    Kind.PDF: "application/pdf",
}
SUPPORTED = ", ".join(EXTENSIONS)
MAX_FILENAME_CHARS = 255


def clean_filename(name: str) -> str:
    """The name without any directory part, bounded; 400 when nothing is left."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    base = "".join(ch for ch in base if ch.isprintable())
    if not base:
        raise InvalidArgument("file: the upload has no file name")
    return base[:MAX_FILENAME_CHARS]


def detect(filename: str, content_type: str | None) -> Kind:
    """The kind of an upload from its name and declared content type."""
    ext = ""
    if "." in filename:
        ext = "." + filename.rsplit(".", 1)[1].lower()
    declared = (content_type or "").split(";", 1)[0].strip().lower()
    by_ext = EXTENSIONS.get(ext)
    by_type = CONTENT_TYPES.get(declared)
    if by_ext is None and by_type is None:
        shown = f"extension {ext!r}" if ext else "no extension"
        raise UnsupportedFile(
            f"file: unsupported file type ({filename!r}: {shown}, content type {declared or 'none'!r}); "
            f"supported: {SUPPORTED}"
        )
    if by_ext is None:
        assert by_type is not None
        return by_type
    if by_type is None:
        if declared not in GENERIC_TYPES and not declared.startswith("text/"):
            raise UnsupportedFile(
                f"file: {filename!r} has the extension {ext!r} but the content type {declared!r}"
            )
        if declared.startswith("text/") and by_ext is Kind.PDF:
            raise UnsupportedFile(
                f"file: {filename!r} has the extension '.pdf' but the content type {declared!r}"
            )
        return by_ext
    # Markdown and HTML are text: a text/plain part is either of them.
    compatible = by_type is by_ext or (by_type is Kind.TEXT and by_ext in (Kind.MARKDOWN, Kind.HTML))
    if not compatible:
        raise UnsupportedFile(
            f"file: {filename!r} has the extension {ext!r} ({by_ext}) but the content type "
            f"{declared!r} ({by_type})"
        )
    return by_ext


@dataclass(frozen=True, slots=True)
class Extracted:
    """A file's text and, for a PDF, how many pages it has."""

    text: str
    pages: int = 0


def extract(data: bytes, kind: Kind, *, max_chars: int, max_pages: int) -> Extracted:
    """The text of ``data``; UnsupportedFile when it is not readable as ``kind``, has no text,
    or has more than ``max_chars`` characters (``max_pages`` pages for a PDF)."""
    if kind is Kind.PDF:
        extracted = _pdf(data, max_chars=max_chars, max_pages=max_pages)
    else:
        text = decode_text(data)
        extracted = Extracted(html_text(text) if kind is Kind.HTML else text)
    text = extracted.text
    if len(text) > max_chars:
        raise UnsupportedFile(f"file: its text has {len(text)} characters, over the limit of {max_chars}")
    if not text.strip():
        what = (
            "the PDF has no extractable text (scanned pages are not read)"
            if kind is Kind.PDF
            else ("the file has no text")
        )
        raise UnsupportedFile(f"file: {what}")
    return extracted


def decode_text(data: bytes) -> str:
    """UTF-8 text (a byte-order mark is dropped); UnsupportedFile for anything else."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnsupportedFile(
            f"file: not UTF-8 text (invalid byte at offset {exc.start}); save it as UTF-8"
        ) from None
    if "\x00" in text:
        raise UnsupportedFile("file: the text holds NUL characters (a binary file?)")
    return text


# Elements whose text is not content.
_SKIPPED = frozenset({"script", "style", "template", "noscript"})
# Elements that end a line (blocks); the chunker splits paragraphs on blank lines.
_BLOCKS = frozenset(
    {
        "p", "div", "section", "article", "header", "footer", "main", "aside", "nav", "li", "ul",
        "ol", "dl", "dt", "dd", "table", "tr", "blockquote", "pre", "h1", "h2", "h3", "h4", "h5",
        "h6", "hr", "figure", "figcaption", "form", "details", "summary", "title", "body", "html",
    }
)  # fmt: skip
_SPACES = re.compile(r"[ \t\r\f\v]+")
_WHITESPACE = re.compile(r"[ \t\r\n\f\v]+")
_BLANKS = re.compile(r"\n{3,}")


class _TextCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping: list[str] = []
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self._skipping.append(tag)
        elif tag == "br":
            self.parts.append("\n")
        elif tag in _BLOCKS:
            if tag == "pre":
                self._pre += 1
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if self._skipping and self._skipping[-1] == tag:
            self._skipping.pop()
        elif tag in _BLOCKS:
            if tag == "pre" and self._pre:
                self._pre -= 1
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._skipping:
            return
        # Whitespace in markup is one space, except in preformatted text.
        self.parts.append(data if self._pre else _WHITESPACE.sub(" ", data))


def html_text(markup: str) -> str:
    """The visible text of an HTML document: tags, scripts and styles dropped, entities
    decoded, one blank line between blocks."""
    collector = _TextCollector()
    collector.feed(markup)
    collector.close()
    lines = (_SPACES.sub(" ", line).strip() for line in "".join(collector.parts).split("\n"))
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


def _pdf(data: bytes, *, max_chars: int, max_pages: int) -> Extracted:
    from pypdf import PdfReader

    if not data.lstrip()[:1024].startswith(b"%PDF-") and b"%PDF-" not in data[:1024]:
        raise UnsupportedFile("file: not a PDF (no %PDF- header)")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnsupportedFile("file: the PDF is encrypted with a password")
        count = len(reader.pages)
        if count > max_pages:
            raise UnsupportedFile(f"file: the PDF has {count} pages, over the limit of {max_pages}")
        texts: list[str] = []
        size = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            size += len(text) + 2
            if size > max_chars + 2:
                raise UnsupportedFile(f"file: its text has more than {max_chars} characters (the limit)")
            texts.append(text.strip())
    except UnsupportedFile:
        raise
    except Exception as exc:
        # A damaged or hostile file: pypdf raises more than its own PyPdfError on those
        # (ValueError, KeyError, zlib.error, RecursionError, ...); none of them is our failure.
        raise UnsupportedFile(
            f"file: the PDF cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    return Extracted("\n\n".join(t for t in texts if t), pages=count)
