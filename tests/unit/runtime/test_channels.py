"""Upstream address parsing: one instance, a list of instances, dns:///, quic://, and bad input."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gateway.config import GatewaySettings
from services.runtime.channels import Target, balanced_service_config, parse_address


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:7001", Target("127.0.0.1:7001")),
        ("policy:50052", Target("policy:50052")),
        (" 127.0.0.1:7001 ", Target("127.0.0.1:7001")),
        ("127.0.0.1:7001,127.0.0.1:7002", Target("ipv4:127.0.0.1:7001,127.0.0.1:7002", balanced=True)),
        ("127.0.0.1:7001, 10.0.0.2:7001", Target("ipv4:127.0.0.1:7001,10.0.0.2:7001", balanced=True)),
        ("localhost:7001,127.0.0.1:7002", Target("ipv4:127.0.0.1:7001,127.0.0.1:7002", balanced=True)),
        ("[::1]:7001,[::1]:7002", Target("ipv6:[::1]:7001,[::1]:7002", balanced=True)),
        ("ipv4:127.0.0.1:7001", Target("ipv4:127.0.0.1:7001", balanced=True)),
        ("dns:///policy.llmesh.svc:50052", Target("dns:///policy.llmesh.svc:50052", balanced=True)),
        ("quic://10.0.0.1:4433", Target("quic://10.0.0.1:4433", quic=True)),
    ],
)
def test_parse_address(address: str, expected: Target) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("", "empty address"),
        ("127.0.0.1:7001,", "empty entry"),
        ("127.0.0.1:7001,,127.0.0.1:7002", "empty entry"),
        ("127.0.0.1:7001,127.0.0.1", "not host:port"),
        ("127.0.0.1:7001,127.0.0.1:http", "no valid port"),
        ("127.0.0.1:7001,127.0.0.1:70000", "no valid port"),
        ("policy-a:50052,policy-b:50052", "not an IP address"),
        ("127.0.0.1:7001,[::1]:7001", "mixes IPv4 and IPv6"),
        ("::1:7001,::1:7002", "in brackets"),
        ("127.0.0.1:7001,127.0.0.1:7001", "listed more than once"),
        ("ipv6:127.0.0.1:7001", "ipv6: target with IPv4"),
        ("quic://10.0.0.1:4433,10.0.0.2:4433", "quic:// address names one instance"),
        ("dns:///", "dns:///name:port"),
        ("dns:///a:1,b:1", "dns:///name:port"),
    ],
)
def test_bad_address_says_what_is_wrong(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_address(address)


def test_service_config_balances_and_health_checks_the_named_service() -> None:
    config = json.loads(balanced_service_config("llmesh.v1.PolicyService"))
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert config["healthCheckConfig"] == {"serviceName": "llmesh.v1.PolicyService"}


def test_gateway_settings_take_a_list_and_reject_a_malformed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMESH_GATEWAY_POLICY_ADDRESS", "127.0.0.1:7001,127.0.0.1:7002")
    assert GatewaySettings().policy_address == "127.0.0.1:7001,127.0.0.1:7002"
    monkeypatch.setenv("LLMESH_GATEWAY_CACHE_ADDRESS", "127.0.0.1:7001,,127.0.0.1:7002")
    with pytest.raises(ValidationError, match=r"(?s)cache_address.*empty entry"):
        GatewaySettings()
