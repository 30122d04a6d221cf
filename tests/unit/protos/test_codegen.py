"""The generated stubs in the tree match the .proto contracts."""

from __future__ import annotations

from llmesh import codegen


def test_stubs_are_current() -> None:
    stale = codegen.stale_stubs()
    assert stale == [], f"stale stubs {stale}: run `llmesh protos build`"


def test_every_contract_has_stubs() -> None:
    names = {p.stem for p in codegen.proto_files()}
    assert {"common", "inference", "policy", "cache", "embeddings", "chat"} <= names


def test_typed_grpc_stubs_are_generated_and_current() -> None:
    # stale_stubs() compares every suffix, the typed gRPC stubs included: they must be among them.
    expected = codegen.expected_outputs(codegen.PROTO_ROOT)
    typed = [p for p in expected if p.name.endswith("_pb2_grpc.pyi")]
    assert len(typed) == len(codegen.proto_files())
    assert all(p.exists() for p in typed), "run `llmesh protos build`"
    stub = (codegen.PACKAGE_DIR / "cache_pb2_grpc.pyi").read_text()
    # The async stub carries the request and response types of each RPC.
    assert "class ContextCacheServiceAsyncStub(ContextCacheServiceStub):" in stub
    assert (
        "LookupResponse: _aio.UnaryUnaryMultiCallable"
        "[_cache_pb2.LookupResponseRequest, _cache_pb2.LookupResponseResponse]"
    ) in stub
