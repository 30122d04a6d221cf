"""Authenticated mesh: real policy and inference gRPC servers on mTLS with certificates from
``llmesh certs create``; callers are authorised by their certificate identity (services.runtime.authz).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from llmesh.v1 import chat_pb2_grpc, inference_pb2, inference_pb2_grpc, policy_pb2, policy_pb2_grpc

from policy.config import DEFAULT_RULESET
from services.runtime import certs
from services.runtime.cli.smoke import grpcurl_path
from services.runtime.server import RunningServer, ServiceBinding, build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.fake_inference import FakeInference, inference_binding
from tests.integration.policy.conftest import Served, serve_policy, tenant_md

RULESET = "version: sec\nrules:\n  - id: words\n    detector: keyword\n    scope: both\n    action: block\n"
RULESET += "    options: {keywords: [zebra]}\n"
RELOAD = policy_pb2.ReloadRulesRequest(yaml=RULESET)


@pytest.fixture
def ruleset_file(tmp_path: Path) -> Path:
    path = tmp_path / "ruleset.yaml"
    path.write_bytes(DEFAULT_RULESET.read_bytes())
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `llmesh certs create` writes: a CA and one certificate per identity."""
    directory = tmp_path_factory.mktemp("pki")
    assert certs.cli(["create", "--dir", str(directory)]) == 0
    return directory


def serve_tls(monkeypatch: pytest.MonkeyPatch, pki: Path, identity: str) -> None:
    """The next server built in this process serves mTLS with ``identity``'s certificate."""
    monkeypatch.setenv("LLMESH_TLS_CERT_FILE", str(pki / f"{identity}.pem"))
    monkeypatch.setenv("LLMESH_TLS_KEY_FILE", str(pki / f"{identity}.key"))
    monkeypatch.setenv("LLMESH_TLS_CA_FILE", str(pki / "ca.pem"))


def channel_as(pki: Path, port: int, identity: str | None) -> grpc.aio.Channel:
    """A channel presenting ``identity``'s certificate (None: TLS without a client certificate)."""
    ca = (pki / "ca.pem").read_bytes()
    if identity is None:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(pki / f"{identity}.key").read_bytes(),
            certificate_chain=(pki / f"{identity}.pem").read_bytes(),
        )
    return grpc.aio.secure_channel(f"localhost:{port}", credentials)


@pytest.fixture
async def policy_tls(
    redis_url: str, ruleset_file: Path, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Served]:
    serve_tls(monkeypatch, pki, "policy")
    served = await serve_policy(redis_url, ruleset_file, admin_token="")
    try:
        yield served
    finally:
        await served.close()


async def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value.code(), caught.value.details() or ""


@pytest.mark.parametrize("client", ["plaintext", "no-certificate"])
async def test_caller_without_certificate_is_refused_at_the_handshake(
    policy_tls: Served, pki: Path, client: str
) -> None:
    port = policy_tls.server.port
    if client == "plaintext":
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    else:
        channel = channel_as(pki, port, None)
    async with channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        code, _ = await _code(
            stub.CheckInput(policy_pb2.CheckInputRequest(), metadata=tenant_md("a"), timeout=5)
        )
    assert code == grpc.StatusCode.UNAVAILABLE


async def test_cache_identity_may_not_reload_or_check(policy_tls: Served, pki: Path) -> None:
    async with channel_as(pki, policy_tls.server.port, "cache") as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        code, details = await _code(stub.ReloadRules(RELOAD, metadata=tenant_md("default"), timeout=5))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "'cache'" in details and "ReloadRules" in details
        code, details = await _code(
            stub.CheckInput(policy_pb2.CheckInputRequest(), metadata=tenant_md("acme"), timeout=5)
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "'cache'" in details and "/llmesh.v1.PolicyService/CheckInput" in details
        # Nor the batched checks, which name their tenants in the message: only the gateway.
        checks = policy_pb2.CheckInputsRequest(checks=[policy_pb2.InputCheck(tenant="acme")])
        code, details = await _code(stub.CheckInputs(checks, timeout=5).read())
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "'cache'" in details and "/llmesh.v1.PolicyService/CheckInputs" in details
    assert policy_tls.app.service.get_ruleset().version != "sec"


async def test_gateway_identity_needs_a_tenant(policy_tls: Served, pki: Path) -> None:
    async with channel_as(pki, policy_tls.server.port, "gateway") as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        code, details = await _code(stub.CheckOutput(policy_pb2.CheckOutputRequest(text="hi"), timeout=5))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "x-llmesh-tenant" in details
        reply = await stub.CheckOutput(
            policy_pb2.CheckOutputRequest(text="hi"), metadata=tenant_md("acme"), timeout=5
        )
        assert reply.action == policy_pb2.POLICY_ACTION_ALLOW
        # The batched checks name each check's tenant instead (no x-llmesh-tenant).
        checks = policy_pb2.CheckInputsRequest(
            checks=[policy_pb2.InputCheck(tenant="acme", input=policy_pb2.CheckInputRequest())]
        )
        batch = [r async for r in stub.CheckInputs(checks, timeout=5)]
        assert [r.verdict.action for r in batch] == [policy_pb2.POLICY_ACTION_ALLOW]
        # The gateway is no admin either.
        code, _ = await _code(stub.ReloadRules(RELOAD, metadata=tenant_md("default"), timeout=5))
        assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_admin_certificate_reloads_without_a_token(policy_tls: Served, pki: Path) -> None:
    async with channel_as(pki, policy_tls.server.port, "admin") as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        reply = await stub.ReloadRules(policy_pb2.ReloadRulesRequest(yaml=RULESET), timeout=5)
    assert reply.version.startswith("sec+") and reply.rule_count == 1


@pytest.fixture
async def inference_tls(pki: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningServer]:
    serve_tls(monkeypatch, pki, "inference")
    server = await build_server(ServiceSettings(port=0), [inference_binding(FakeInference())])
    try:
        yield server
    finally:
        await server.stop(0)


async def test_only_the_gateway_generates_and_the_cache_tokenizes(
    inference_tls: RunningServer, pki: Path
) -> None:
    request = inference_pb2.GenerateRequest(prompt="hello", sampling={"max_tokens": 2})
    async with channel_as(pki, inference_tls.port, "cache") as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        code, details = await _code(stub.Generate(request, timeout=5))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "'cache'" in details and "Generate" in details
        await stub.Tokenize(inference_pb2.TokenizeRequest(prompt="a b"), timeout=5)
    async with channel_as(pki, inference_tls.port, "gateway") as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        assert (await stub.Generate(request, timeout=5)).choices


async def _grpcurl_list(port: int) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        grpcurl_path(),
        "-plaintext",
        f"127.0.0.1:{port}",
        "list",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode()


def unimplemented_chat() -> Any:
    """grpcio's generated base servicer (every method UNIMPLEMENTED); its stub types it abstract."""
    base: Any = chat_pb2_grpc.ChatServiceServicer
    return base()


async def test_reflection_is_a_setting() -> None:
    inference = inference_binding(FakeInference())
    chat = ServiceBinding(
        name="llmesh.v1.ChatService",
        add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
        servicer=unimplemented_chat(),
    )
    servers = [
        await build_server(ServiceSettings(port=0), [inference]),
        await build_server(ServiceSettings(port=0), [chat]),
        await build_server(ServiceSettings(port=0, reflection=False), [inference]),
        await build_server(ServiceSettings(port=0, reflection=False), [chat]),
    ]
    try:
        for server, name in zip(servers[:2], ("InferenceService", "ChatService"), strict=True):
            code, out = await _grpcurl_list(server.port)
            assert code == 0 and f"llmesh.v1.{name}" in out
        for server in servers[2:]:
            code, out = await _grpcurl_list(server.port)
            assert code != 0 and "does not support the reflection API" in out
    finally:
        for server in servers:
            await server.stop(0)
