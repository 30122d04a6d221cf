"""Who may call what: the caller's certificate identity, the access table, tenants and admin calls.

Every llmesh server checks each call (health and reflection excepted: passing the handshake is
enough for those) before its handler runs (:class:`Authorizer`, used by
``services.runtime.interceptors.ServerInterceptor``):

* **Identity.** A caller's identity is the Common Name of its certificate (the first subject
  alternative name when it has none): ``llmesh certs create`` issues ``gateway``, ``cache``,
  ``policy``, ``inference``, ``embeddings`` and ``admin``. It comes from the gRPC mTLS handshake
  and, for a call that arrived through the QUIC endpoint, from the QUIC client's certificate
  (:data:`TUNNEL_PEERS`: the endpoint's local socket to the gRPC server is never trusted for its
  own sake). Every identity a call presents must be allowed.
* **Enforcement.** With the server on TLS, or for a call through the QUIC tunnel, every method
  other than the public ones needs an allowed identity: none gives UNAUTHENTICATED, another
  PERMISSION_DENIED naming identity and method. A plaintext server (``llmesh up`` on loopback)
  has no identities to check; the tenant and admin rules below hold there too.
* **Tenants.** A method that reads or writes tenant-scoped state (sessions, responses,
  documents, audit, per-tenant rules) needs ``x-llmesh-tenant``; a call without one is refused
  with INVALID_ARGUMENT, never served as the ``default`` tenant. Only the identities the table
  lets call such a method (the gateway, which authenticated the tenant's API key) can name a
  tenant, so a tenant is trusted only from them.
* **Admin.** An admin method (policy ``ReloadRules``) needs an admin credential whatever the
  transport: the ``admin`` certificate identity, or the service's admin token
  (``LLMESH_<SERVICE>_ADMIN_TOKEN``) sent as ``authorization: Bearer <token>`` or
  ``x-llmesh-admin-token: <token>``, compared in constant time. With neither configured it is
  refused with a message that says how to enable it.

The table (:data:`RULES`) is built from the compiled service descriptors, so a method added to a
``.proto`` without a rule fails at import.
"""

from __future__ import annotations

import hmac
import logging
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import FileDescriptor
from llmesh.v1 import cache_pb2, chat_pb2, embeddings_pb2, inference_pb2, policy_pb2

from services.runtime import context as rc
from services.runtime.errors import InvalidArgument, PermissionDenied, Unauthenticated

log = logging.getLogger(__name__)

GATEWAY = "gateway"
CACHE = "cache"
ADMIN = "admin"
ADMIN_TOKEN = "x-llmesh-admin-token"
AUTHORIZATION = "authorization"
_BEARER = "bearer "


@dataclass(frozen=True)
class Rule:
    """Who may call one method."""

    # Certificate identities allowed to call it (checked when there are identities to check).
    callers: frozenset[str] = frozenset()
    # The call must name its tenant (x-llmesh-tenant): the method touches tenant-scoped state.
    tenant: bool = False
    # Needs the admin credential (admin identity or admin token), on every transport.
    admin: bool = False
    # Anyone may call it (the gateway's ChatService: it authenticates API keys itself).
    public: bool = False


def allow(*callers: str, tenant: bool = False) -> Rule:
    """A rule for the identities ``callers``."""
    return Rule(callers=frozenset(callers), tenant=tenant)


PUBLIC = Rule(public=True)
ADMIN_ONLY = Rule(callers=frozenset({ADMIN}), admin=True)
_TENANT_DATA = allow(GATEWAY, tenant=True)


def service_rules(
    file: FileDescriptor, service: str, rules: Mapping[str, Rule], default: Rule | None = None
) -> dict[str, Rule]:
    """``{"/pkg.Service/Method": rule}`` for every method of ``service``; each needs a rule."""
    descriptor = file.services_by_name[service]
    unknown = set(rules) - set(descriptor.methods_by_name)
    if unknown:
        raise RuntimeError(f"access rules for methods {descriptor.full_name} lacks: {sorted(unknown)}")
    table: dict[str, Rule] = {}
    for name in descriptor.methods_by_name:
        rule = rules.get(name, default)
        if rule is None:
            raise RuntimeError(f"{descriptor.full_name}/{name} has no access rule")
        table[f"/{descriptor.full_name}/{name}"] = rule
    return table


# The mesh's access table: only the gateway reaches the data paths; the cache also embeds and
# tokenizes (cache/clients.py); ReloadRules is for admins. Inference and Embed hold no tenant state.
RULES: dict[str, Rule] = {
    **service_rules(chat_pb2.DESCRIPTOR, "ChatService", {}, default=PUBLIC),
    **service_rules(
        policy_pb2.DESCRIPTOR,
        "PolicyService",
        {
            "GetRuleset": allow(GATEWAY, ADMIN, tenant=True),
            "ReloadRules": ADMIN_ONLY,
            # Many tenants' answers over one call, each naming its tenant: only the gateway.
            "ModerateStreams": allow(GATEWAY),
            # Many requests' input checks in one call, each naming its tenant: only the gateway.
            "CheckInputs": allow(GATEWAY),
        },
        default=_TENANT_DATA,
    ),
    **service_rules(cache_pb2.DESCRIPTOR, "ContextCacheService", {}, default=_TENANT_DATA),
    **service_rules(
        embeddings_pb2.DESCRIPTOR, "EmbeddingService", {"Embed": allow(GATEWAY, CACHE)}, default=_TENANT_DATA
    ),
    **service_rules(
        inference_pb2.DESCRIPTOR,
        "InferenceService",
        {"Tokenize": allow(GATEWAY, CACHE), "GetModelInfo": allow(GATEWAY, CACHE)},
        default=allow(GATEWAY),
    ),
}


def certificate_identity(auth_context: Mapping[str, Any]) -> str | None:
    """The identity in a gRPC auth context: the certificate's CN, else its first SAN."""
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        values = auth_context.get(key) or ()
        for value in values:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if text:
                return text
    return None


class TunnelPeers:
    """Identities of QUIC clients, by the address of the socket the QUIC endpoint opened to this
    process's gRPC server for their stream (``services.runtime.quic.server``).

    Only the endpoint in this process writes here, and a socket address belongs to one open
    connection at a time, so a call from that address is the QUIC client's call. The entry is
    removed when the socket closes.
    """

    def __init__(self) -> None:
        self._by_peer: dict[str, str] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(sockname: tuple[Any, ...]) -> str:
        """A socket address as gRPC's ``context.peer()`` names it (``ipv4:h:p`` / ``ipv6:[h]:p``)."""
        host, port = str(sockname[0]), int(sockname[1])
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def add(self, sockname: tuple[Any, ...], identity: str) -> str:
        key = self.key(sockname)
        with self._lock:
            self._by_peer[key] = identity
        return key

    def remove(self, key: str) -> None:
        with self._lock:
            self._by_peer.pop(key, None)

    def get(self, peer: str) -> str | None:
        if not self._by_peer:
            return None
        return self._by_peer.get(urllib.parse.unquote(peer))


TUNNEL_PEERS = TunnelPeers()


def _sent_token(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if not isinstance(value, str):
            continue
        if key == ADMIN_TOKEN:
            return value.strip()
        if key == AUTHORIZATION and value[: len(_BEARER)].lower() == _BEARER:
            return value[len(_BEARER) :].strip()
    return None


class Authorizer:
    """Checks each call against the access table (see module doc)."""

    def __init__(
        self,
        rules: Mapping[str, Rule],
        *,
        tls: bool,
        admin_token: str = "",
        admin_token_setting: str = "LLMESH_<SERVICE>_ADMIN_TOKEN",
        tunnel_peers: TunnelPeers = TUNNEL_PEERS,
    ) -> None:
        self._rules = dict(rules)
        self._tls = tls
        self._admin_token = admin_token.encode()
        self._admin_setting = admin_token_setting
        self._tunnel = tunnel_peers

    def rule(self, method: str) -> Rule | None:
        return self._rules.get(method)

    def identities(self, context: grpc.aio.ServicerContext[Any, Any]) -> list[str]:
        """Every authenticated identity the call presents (mTLS peer, QUIC client)."""
        found: list[str] = []
        if self._tls:
            identity = certificate_identity(context.auth_context())
            if identity is not None:
                found.append(identity)
        tunnel = self._tunnel.get(context.peer())
        if tunnel is not None:
            found.append(tunnel)
        return found

    def check(self, context: grpc.aio.ServicerContext[Any, Any], method: str, ctx: rc.RequestContext) -> None:
        """Raises Unauthenticated, PermissionDenied or InvalidArgument when the call may not run."""
        rule = self._rules.get(method)
        if rule is not None and rule.public:
            return
        identities = self.identities(context)
        enforced = self._tls or bool(identities)
        try:
            if rule is None:
                if enforced:
                    raise PermissionDenied(f"{method} has no access rule on this server")
                return
            if rule.admin:
                self._check_admin(context, method, identities)
            elif enforced:
                if not identities:
                    raise Unauthenticated(f"{method} needs a client certificate (mTLS); none was presented")
                for identity in identities:
                    if identity not in rule.callers:
                        raise PermissionDenied(f"identity {identity!r} may not call {method}")
            if rule.tenant and not ctx.tenant:
                raise InvalidArgument(
                    f"{method} needs the {rc.TENANT!r} metadata naming the tenant; "
                    "a call without one is refused (no default tenant inside the mesh)"
                )
        except (PermissionDenied, Unauthenticated) as exc:
            log.warning("refused %s from %s: %s", method, identities or context.peer(), exc.message)
            raise

    def _check_admin(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, identities: list[str]
    ) -> None:
        if identities and all(identity == ADMIN for identity in identities):
            return
        sent = _sent_token(context.invocation_metadata())
        if self._admin_token and sent is not None:
            if hmac.compare_digest(sent.encode(), self._admin_token):
                return
            raise PermissionDenied(f"the admin token sent to {method} does not match {self._admin_setting}")
        if not self._admin_token:
            who = f"identity {identities[0]!r}" if identities else "this caller"
            raise PermissionDenied(
                f"{method} needs an admin credential and {who} has none: set {self._admin_setting} on "
                "the service and send it as 'authorization: Bearer <token>', or call with the "
                f"{ADMIN!r} certificate over mTLS (llmesh certs create issues one)"
            )
        if identities:
            raise PermissionDenied(
                f"identity {identities[0]!r} may not call {method}: send the admin token "
                f"({self._admin_setting}) as 'authorization: Bearer <token>' or use the {ADMIN!r} certificate"
            )
        raise Unauthenticated(
            f"{method} needs an admin credential: send the value of {self._admin_setting} as "
            "'authorization: Bearer <token>' (or x-llmesh-admin-token)"
        )
