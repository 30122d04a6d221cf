"""Optional TLS / mutual TLS between llmesh services.

One set of settings per process (``LLMESH_TLS_*``), used both for the server a
service runs and for the channels it opens to other services:

* ``LLMESH_TLS_CERT_FILE`` / ``LLMESH_TLS_KEY_FILE``: this process's certificate
  and key (``llmesh certs create`` makes development ones). Setting them turns TLS on.
* ``LLMESH_TLS_CA_FILE``: the CA that signs peers' certificates.
* ``LLMESH_TLS_CLIENT_AUTH`` (default true): servers require a client certificate
  signed by that CA (mutual TLS), so a caller without one is refused at the handshake.
* ``LLMESH_TLS_ALLOW_PLAINTEXT`` (default false): without TLS a service serves on
  loopback only (``llmesh up``, tests); on any other address it refuses to start
  unless this says the operator knowingly runs an unauthenticated mesh.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.runtime.errors import FailedPrecondition


class TLSSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMESH_TLS_", extra="ignore")

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    client_auth: bool = True
    # Name to verify in the peer's certificate when dialling by IP (default: the host dialled).
    server_name: str = ""
    # Serve plaintext gRPC beyond loopback anyway (nobody authenticated: every caller is trusted).
    allow_plaintext: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file)

    def _read(self, path: str, what: str) -> bytes:
        if not path:
            raise FailedPrecondition(f"TLS is on but LLMESH_TLS_{what} is not set")
        try:
            return Path(path).expanduser().read_bytes()
        except OSError as exc:
            raise FailedPrecondition(f"cannot read LLMESH_TLS_{what} {path!r}: {exc.strerror}") from exc

    def server_credentials(self) -> grpc.ServerCredentials:
        ca = self._read(self.ca_file, "CA_FILE") if (self.ca_file or self.client_auth) else None
        return grpc.ssl_server_credentials(
            [(self._read(self.key_file, "KEY_FILE"), self._read(self.cert_file, "CERT_FILE"))],
            root_certificates=ca,
            require_client_auth=self.client_auth,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self._read(self.ca_file, "CA_FILE"),
            private_key=self._read(self.key_file, "KEY_FILE"),
            certificate_chain=self._read(self.cert_file, "CERT_FILE"),
        )

    def grpcurl_flags(self) -> list[str]:
        """What grpcurl needs to talk to a server under these settings."""
        if not self.enabled:
            return ["-plaintext"]
        flags = ["-cacert", self.ca_file, "-cert", self.cert_file, "-key", self.key_file]
        if self.server_name:
            flags += ["-servername", self.server_name]
        return flags


def tls_settings() -> TLSSettings:
    return TLSSettings()
