"""``llmesh certs create``: a local CA and per-service certificates for development.

The QUIC transport (``services.runtime.quic``) verifies the server's certificate against a CA file by
default. For a development mesh this command makes that CA and one key pair per service, each with
the service name, ``localhost``, ``127.0.0.1`` and ``::1`` (plus any ``--san``) as subject alternative
names. Production deployments bring their own PKI and point the ``LLMESH_QUIC_*`` settings at it.

The Common Name of each certificate is the caller identity the services authorise
(``services.runtime.authz``): ``gateway``, ``cache``, ... and ``admin``, a client-only certificate
(no server names) for operators' admin calls such as policy ``ReloadRules``.

Layout of ``DIR`` (default ``<data_dir>/certs``)::

    ca.pem  ca.key  <identity>.pem  <identity>.key
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.runtime.authz import ADMIN
from services.runtime.settings import data_dir

logger = logging.getLogger(__name__)

DEFAULT_SERVICES = ("gateway", "inference", "policy", "cache", "embeddings")
# Client-only identities: they call services but serve nothing.
CLIENT_IDENTITIES = (ADMIN,)
DEFAULT_IDENTITIES = (*DEFAULT_SERVICES, *CLIENT_IDENTITIES)
_DEFAULT_SANS = ("localhost", "127.0.0.1", "::1")


def default_cert_dir() -> Path:
    """Where ``llmesh certs create`` writes and the QUIC settings look by default."""
    return data_dir() / "certs"


@dataclass(frozen=True)
class IssuedCert:
    """Paths of one certificate and its private key."""

    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _san_entries(names: Sequence[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def create_ca(directory: Path, days: int = 825) -> IssuedCert:
    """Make (or overwrite) ``ca.pem``/``ca.key`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmesh development CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    issued = IssuedCert(directory / "ca.pem", directory / "ca.key")
    _write_key(issued.key, key)
    _write_cert(issued.cert, cert)
    return issued


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca.key'}: expected an EC private key")
    return cert, key


def issue(
    directory: Path, name: str, sans: Sequence[str] = (), days: int = 397, *, client_only: bool = False
) -> IssuedCert:
    """Issue ``<name>.pem``/``<name>.key`` signed by the CA in ``directory``.

    The certificate's Common Name is ``name`` (the identity services authorise). It is valid for
    both server and client authentication and names ``name`` plus the loopback names and ``sans``
    as subject alternative names; with ``client_only``, for client authentication only and with
    ``name`` as its one subject alternative name (it cannot pass for a server).
    """
    ca_cert, ca_key = _load_ca(directory)
    san_names = [name] if client_only else [name, *_DEFAULT_SANS, *sans]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if not client_only:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_san_entries(san_names)), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    issued = IssuedCert(directory / f"{name}.pem", directory / f"{name}.key")
    _write_key(issued.key, key)
    _write_cert(issued.cert, cert)
    return issued


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmesh certs", description="Development certificates.")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="make a local CA (unless present) and service certificates")
    create.add_argument("--dir", type=Path, default=None, help="output folder (default <data_dir>/certs)")
    create.add_argument(
        "--service",
        action="append",
        dest="services",
        help=f"identity to issue for (repeatable; default: {', '.join(DEFAULT_IDENTITIES)})",
    )
    create.add_argument("--san", action="append", default=[], help="extra DNS name or IP (repeatable)")
    create.add_argument("--force-ca", action="store_true", help="replace an existing CA")
    return parser


def cli(argv: list[str]) -> int:
    """Entry point of ``llmesh certs``; returns the exit status."""
    args = _parser().parse_args(argv)
    directory: Path = args.dir or default_cert_dir()
    if args.force_ca or not (directory / "ca.pem").exists() or not (directory / "ca.key").exists():
        ca = create_ca(directory)
        print(f"CA       {ca.cert}")
    else:
        print(f"CA       {directory / 'ca.pem'} (kept; --force-ca replaces it)")
    for name in args.services or DEFAULT_IDENTITIES:
        issued = issue(directory, name, args.san, client_only=name in CLIENT_IDENTITIES)
        print(f"{name:<10} {issued.cert}  {issued.key}")
    return 0
