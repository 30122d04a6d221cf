"""llmesh certs create: CA and service certificates that verify against each other."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from services.runtime import certs


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_create_issues_certificates_signed_by_the_ca(tmp_path: Path) -> None:
    assert certs.cli(["create", "--dir", str(tmp_path), "--service", "inference", "--san", "10.0.0.7"]) == 0
    ca = _load(tmp_path / "ca.pem")
    leaf = _load(tmp_path / "inference.pem")
    public_key = ca.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"inference", "localhost"}
    assert ipaddress.ip_address("10.0.0.7") in sans.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    for key in ("ca.key", "inference.key"):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600


def test_existing_ca_is_kept_unless_forced(tmp_path: Path) -> None:
    certs.cli(["create", "--dir", str(tmp_path), "--service", "cache"])
    first = (tmp_path / "ca.pem").read_bytes()
    certs.cli(["create", "--dir", str(tmp_path), "--service", "policy"])
    assert (tmp_path / "ca.pem").read_bytes() == first
    _load(tmp_path / "policy.pem").verify_directly_issued_by(_load(tmp_path / "ca.pem"))
    certs.cli(["create", "--dir", str(tmp_path), "--service", "policy", "--force-ca"])
    assert (tmp_path / "ca.pem").read_bytes() != first


def test_default_services_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    assert certs.cli(["create"]) == 0
    for name in certs.DEFAULT_SERVICES:
        assert (tmp_path / "certs" / f"{name}.pem").exists()
