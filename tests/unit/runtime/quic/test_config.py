"""Addresses and settings of the QUIC transport."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from services.runtime import certs
from services.runtime.quic.config import (
    QuicSettings,
    client_configuration,
    parse_listen,
    parse_quic_url,
    server_configuration,
)


def test_parse_quic_url() -> None:
    assert parse_quic_url("quic://inference.zone-b:4433") == ("inference.zone-b", 4433, None)
    assert parse_quic_url("quic://10.0.0.2:4433?server_name=inference") == ("10.0.0.2", 4433, "inference")
    assert parse_quic_url("quic://[::1]:4433") == ("::1", 4433, None)
    for bad in ("10.0.0.2:4433", "quic://host", "http://host:1"):
        with pytest.raises(ValueError, match="quic://"):
            parse_quic_url(bad)


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen(":4433") == ("0.0.0.0", 4433)
    assert parse_listen("[::]:4433") == ("::", 4433)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMESH_QUIC_CA_FILE", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("LLMESH_QUIC_STREAM_WINDOW", "1048576")
    settings = QuicSettings()
    assert settings.ca_path() == tmp_path / "ca.pem"
    assert settings.stream_window == 1048576
    assert settings.verify is True


def test_configurations_verify_by_default(tmp_path: Path) -> None:
    certs.cli(["create", "--dir", str(tmp_path), "--service", "inference"])
    settings = QuicSettings(ca_file=str(tmp_path / "ca.pem"), cert_file=str(tmp_path / "inference.pem"))
    client = client_configuration(settings, "inference")
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert client.server_name == "inference"
    assert client.max_stream_data == settings.stream_window
    server = server_configuration(settings)
    assert server.certificate is not None and server.private_key is not None
    assert client.alpn_protocols == server.alpn_protocols
