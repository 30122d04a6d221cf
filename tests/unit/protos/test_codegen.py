"""The generated stubs in the tree match the .proto contracts."""

from __future__ import annotations

from llmesh import codegen


def test_stubs_are_current() -> None:
    stale = codegen.stale_stubs()
    assert stale == [], f"stale stubs {stale}: run `llmesh protos build`"


def test_every_contract_has_stubs() -> None:
    names = {p.stem for p in codegen.proto_files()}
    assert {"common", "inference", "policy", "cache", "embeddings", "chat"} <= names
