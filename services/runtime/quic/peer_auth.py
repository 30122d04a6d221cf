"""Client certificates on the server endpoint: every QUIC client proves an identity.

aioquic's server neither requests nor verifies client certificates (its request switch is "for
test purposes only"), so this module does both, relying on aioquic 1.7.2 internals like
``tunnel.py`` (the version is pinned in pyproject.toml):

* :meth:`ClientCertificates.install` runs when a connection's TLS context exists: it turns the
  certificate request on and makes the context a :class:`_VerifyingContext`, which refuses an
  empty certificate (alert ``certificate_required``) and verifies a given one against the CA of
  ``LLMESH_QUIC_CA_FILE`` for client authentication (alert ``bad_certificate``) inside the
  handshake, before any stream is accepted.
* The identity (the certificate's Common Name, as ``services.runtime.authz`` names callers) is
  kept with each session ticket the connection gets, and a resumed connection (which presents
  no certificate) takes it back from its ticket; a ticket without an identity never resumes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from aioquic import tls
from aioquic._buffer import Buffer
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_IDENTITIES_KEPT = 4096


class AlertCertificateRequired(tls.Alert):
    description = tls.AlertDescription.certificate_required


def identity_of(certificate: x509.Certificate) -> str | None:
    """The caller identity a certificate names: its Common Name, else its first DNS name."""
    for attribute in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME):
        value = attribute.value
        text = value.decode() if isinstance(value, bytes) else value
        if text:
            return text
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    dns = names.get_values_for_type(x509.DNSName)
    return dns[0] if dns else None


def _allows_client_auth(certificate: x509.Certificate) -> bool:
    try:
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True  # no restriction
    return ExtendedKeyUsageOID.CLIENT_AUTH in usage


class _VerifyingContext(tls.Context):
    """A server TLS context that requires and verifies the client's certificate."""

    peer_identity: str | None

    def _server_handle_certificate(self, input_buf: Buffer) -> None:
        super()._server_handle_certificate(input_buf)
        if self._peer_certificate is None:
            raise AlertCertificateRequired("client certificate required")

    def _server_handle_certificate_verify(self, input_buf: Buffer) -> None:
        super()._server_handle_certificate_verify(input_buf)  # checks the signature
        certificate = self._peer_certificate
        assert certificate is not None
        tls.verify_certificate(
            certificate=certificate,
            chain=self._peer_certificate_chain,
            cadata=self._cadata,
            cafile=self._cafile,
            capath=self._capath,
        )
        if not _allows_client_auth(certificate):
            raise tls.AlertBadCertificate("certificate is not valid for client authentication")
        identity = identity_of(certificate)
        if identity is None:
            raise tls.AlertBadCertificate("client certificate names no identity (Common Name)")
        self.peer_identity = identity


class ClientCertificates:
    """Requires a verified client certificate on every connection of one server endpoint and
    remembers the identity behind each session ticket (see module doc)."""

    def __init__(self) -> None:
        self._identities: OrderedDict[bytes, str] = OrderedDict()

    def install(self, connection: QuicConnection) -> None:
        """Called right after aioquic made the connection's TLS context, before any handshake."""
        context = connection.tls
        context._request_client_certificate = True
        context.__class__ = _VerifyingContext
        assert isinstance(context, _VerifyingContext)
        context.peer_identity = None
        fetch = context.get_session_ticket_cb
        issued = context.new_session_ticket_cb
        if fetch is not None:
            context.get_session_ticket_cb = lambda label: self._resume(context, fetch, label)
        if issued is not None:
            context.new_session_ticket_cb = lambda ticket: self._issued(context, issued, ticket)

    @staticmethod
    def identity(connection: QuicConnection) -> str | None:
        """The verified identity of the client of ``connection`` (None until verified)."""
        return getattr(connection.tls, "peer_identity", None) if connection.tls is not None else None

    def _issued(self, context: _VerifyingContext, issued: Any, ticket: tls.SessionTicket) -> None:
        if context.peer_identity is None:
            return  # never resumable: a resumption must stand for a verified certificate
        self._identities[ticket.ticket] = context.peer_identity
        while len(self._identities) > _IDENTITIES_KEPT:
            self._identities.popitem(last=False)
        issued(ticket)

    def _resume(self, context: _VerifyingContext, fetch: Any, label: bytes) -> tls.SessionTicket | None:
        ticket: tls.SessionTicket | None = fetch(label)
        known = self._identities.pop(label, None)
        if ticket is None or known is None:
            return None  # a full handshake, with a certificate
        context.peer_identity = known
        # A resumption authenticates with the ticket: aioquic would still wait for a certificate.
        context._request_client_certificate = False
        return ticket
