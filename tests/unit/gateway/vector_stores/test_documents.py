"""A file's text into the embeddings service's documents, and attributes both ways."""

from __future__ import annotations

import pytest

from gateway.vector_stores.documents import (
    Attribute,
    batches,
    check_attributes,
    decode_attributes,
    encode_attributes,
    part_ids,
    parts,
    split_text,
    text_batches,
)
from services.runtime.errors import InvalidArgument


def test_split_prefers_paragraphs_then_lines_then_spaces() -> None:
    text = "alpha beta.\n\ngamma delta.\nepsilon zeta eta"
    assert split_text(text, 100) == [text]
    assert split_text(text, 20) == ["alpha beta.", "gamma delta.", "epsilon zeta eta"]
    assert split_text("word " * 10, 12) == ["word word", "word word", "word word", "word word", "word word"]
    # A run without any break is cut where it must; nothing is lost or duplicated.
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]
    long = "Sentence number %d is here. " * 500
    pieces = split_text(long, 1000)
    assert all(len(p) <= 1000 for p in pieces)
    assert " ".join(pieces).split() == long.split()


def test_parts_carry_ids_and_metadata() -> None:
    docs = parts(
        "one\n\ntwo",
        file_id="file-1",
        filename="a.md",
        job="j1",
        attributes={"lang": "en", "year": 2024, "draft": False},
        max_chars=4,
    )
    assert [d.id for d in docs] == part_ids("file-1", "j1", 2) == ["file-1.j1.0", "file-1.j1.1"]
    assert [d.text for d in docs] == ["one", "two"]
    assert docs[0].metadata == {
        "file_id": "file-1",
        "filename": "a.md",
        "attr:lang": '"en"',
        "attr:year": "2024",
        "attr:draft": "false",
    }


def test_batches_bound_each_call() -> None:
    docs = parts("a" * 10 + "\n\n" + "b" * 10 + "\n\n" + "c" * 10, file_id="f", filename="f", job="j",
                 attributes={}, max_chars=10)  # fmt: skip
    assert [len(g) for g in batches(docs, 20)] == [2, 1]
    assert [len(g) for g in batches(docs, 5)] == [1, 1, 1]  # one part at least per call
    assert list(text_batches(["aa", "bb", "cc"], 4)) == [["aa", "bb"], ["cc"]]


def test_attributes_round_trip_typed() -> None:
    attributes: dict[str, Attribute] = {"s": "text", "i": 3, "f": 2.5, "b": True, "whole": 4.0}
    decoded = decode_attributes({"file_id": "x", **encode_attributes(attributes)})
    assert decoded == {"s": "text", "i": 3, "f": 2.5, "b": True, "whole": 4}


def test_attribute_bounds() -> None:
    assert check_attributes(None) == {}
    with pytest.raises(InvalidArgument, match="at most 16 pairs"):
        check_attributes({str(i): i for i in range(17)})
    with pytest.raises(InvalidArgument, match="at most 512"):
        check_attributes({"k": "v" * 513})
    with pytest.raises(InvalidArgument, match="keys are 1-64"):
        check_attributes({"k" * 65: 1})
    with pytest.raises(InvalidArgument, match="finite"):
        check_attributes({"k": float("nan")})
