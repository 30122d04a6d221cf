"""`llmesh up`'s plan: several instances of a service, and the addresses each child gets."""

from __future__ import annotations

import pytest

from services.runtime.cli import catalog
from services.runtime.cli.main import main
from services.runtime.cli.up import child_env, plan


def test_policy_instances_get_ports_100_apart_and_the_gateway_gets_their_list() -> None:
    steps = plan(1, ["policy", "gateway"], "127.0.0.1", 0, {"policy": 2})
    assert [(name, port) for name, _, port in steps] == [
        ("policy-1", 50052),
        ("policy-2", 50152),
        ("gateway", 50050),
    ]
    addresses: dict[str, list[str]] = {}
    for _, spec, port in steps:
        addresses.setdefault(spec.name, []).append(f"127.0.0.1:{port}")
    gateway = catalog.service("gateway")
    assert gateway is not None
    env = child_env(gateway, 50050, "127.0.0.1", addresses)
    assert env["LLMESH_GATEWAY_POLICY_ADDRESS"] == "127.0.0.1:50052,127.0.0.1:50152"


def test_a_bad_instance_count_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--policy-replicas", "0"])
    assert "a number of instances from 1 to 9" in capsys.readouterr().err
    with pytest.raises(ValueError, match="policy: 10 instances"):
        plan(1, ["policy"], "127.0.0.1", 0, {"policy": 10})


def test_port_offset_moves_the_gateway_http_port_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMESH_GATEWAY_HTTP_PORT", raising=False)
    gateway = catalog.service("gateway")
    assert gateway is not None
    [(_, spec, port)] = plan(1, ["gateway"], "127.0.0.1", 1000, {})
    assert port == gateway.port + 1000
    assert child_env(spec, port, "127.0.0.1", {})["LLMESH_GATEWAY_HTTP_PORT"] == "9000"
