"""From an attached file to the embeddings service's documents, and from hits back.

A file's text is cut into parts of at most ``part_chars`` characters, at paragraph
boundaries where there are any (then lines, then spaces); each part is one document of
the store's collection, id ``<file id>.<job>.<n>`` (the job id keeps the documents of two
attempts at the same file apart, so one attempt never deletes another's). The embeddings
service chunks each document itself. Metadata carries the file id and name, and the
attached file's attributes as ``attr:<key>`` -> the value in JSON (so a search can filter
on it exactly and give it back typed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from services.runtime.errors import InvalidArgument

FILE_ID_KEY = "file_id"
FILENAME_KEY = "filename"
ATTRIBUTE_PREFIX = "attr:"
MAX_ATTRIBUTES = 16
MAX_ATTRIBUTE_KEY_CHARS = 64
MAX_ATTRIBUTE_VALUE_CHARS = 512

Attribute = str | float | bool


@dataclass(frozen=True, slots=True)
class Part:
    """One document of an attached file."""

    id: str
    text: str
    metadata: dict[str, str]


def split_text(text: str, max_chars: int) -> list[str]:
    """``text`` in pieces of at most ``max_chars``, cut at the last paragraph break (else line
    break, else space) within the limit; only a run without any is cut mid-word."""
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > max_chars:
        piece, after = rest[:max_chars], max_chars
        for sep in ("\n\n", "\n", " "):
            at = rest.rfind(sep, 0, max_chars + len(sep))
            if at > max_chars // 4:
                piece, after = rest[:at], at + len(sep)
                break
        pieces.append(piece.strip())
        rest = rest[after:].lstrip()
    if rest:
        pieces.append(rest)
    return pieces


def part_id(file_id: str, job: str, index: int) -> str:
    return f"{file_id}.{job}.{index}"


def part_ids(file_id: str, job: str, count: int) -> list[str]:
    """The document ids an attempt with ``count`` parts writes (what deleting it removes)."""
    return [part_id(file_id, job, i) for i in range(count)]


def parts(
    text: str,
    *,
    file_id: str,
    filename: str,
    job: str,
    attributes: Mapping[str, Attribute],
    max_chars: int,
) -> list[Part]:
    metadata = {FILE_ID_KEY: file_id, FILENAME_KEY: filename, **encode_attributes(attributes)}
    pieces = split_text(text, max_chars)
    return [Part(part_id(file_id, job, i), piece, dict(metadata)) for i, piece in enumerate(pieces)]


def batches(items: Sequence[Part], max_chars: int) -> Iterator[list[Part]]:
    """Consecutive groups of parts of at most ``max_chars`` characters together (one part at least)."""
    group: list[Part] = []
    size = 0
    for item in items:
        if group and size + len(item.text) > max_chars:
            yield group
            group, size = [], 0
        group.append(item)
        size += len(item.text)
    if group:
        yield group


def text_batches(texts: Sequence[str], max_chars: int) -> Iterator[list[str]]:
    """Consecutive groups of texts of at most ``max_chars`` characters together (one text at least)."""
    group: list[str] = []
    size = 0
    for text in texts:
        if group and size + len(text) > max_chars:
            yield group
            group, size = [], 0
        group.append(text)
        size += len(text)
    if group:
        yield group


def check_attributes(attributes: Mapping[str, Attribute] | None) -> dict[str, Attribute]:
    """OpenAI's bounds on attributes: 16 pairs, keys up to 64 characters, strings up to 512."""
    if not attributes:
        return {}
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidArgument(f"attributes: at most {MAX_ATTRIBUTES} pairs, got {len(attributes)}")
    for key, value in attributes.items():
        if not key or len(key) > MAX_ATTRIBUTE_KEY_CHARS:
            raise InvalidArgument(f"attributes: keys are 1-{MAX_ATTRIBUTE_KEY_CHARS} characters")
        if isinstance(value, str) and len(value) > MAX_ATTRIBUTE_VALUE_CHARS:
            raise InvalidArgument(
                f"attributes.{key}: strings are at most {MAX_ATTRIBUTE_VALUE_CHARS} characters"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgument(f"attributes.{key}: numbers must be finite")
    return dict(attributes)


def encode_value(value: Attribute) -> str:
    """One canonical JSON form per value (``1`` and ``1.0`` are the same number)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float) and float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return json.dumps(value)


def encode_attributes(attributes: Mapping[str, Attribute]) -> dict[str, str]:
    return {ATTRIBUTE_PREFIX + key: encode_value(value) for key, value in attributes.items()}


def decode_attributes(metadata: Mapping[str, str]) -> dict[str, Attribute]:
    out: dict[str, Attribute] = {}
    for key, raw in metadata.items():
        if key.startswith(ATTRIBUTE_PREFIX):
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
            if isinstance(value, str | int | float | bool):
                out[key[len(ATTRIBUTE_PREFIX) :]] = value
    return out
