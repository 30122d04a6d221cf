"""Wires the policy service together: Redis, audit log, versions, ruleset store, servicer.

:func:`create` is the factory :func:`services.runtime.entry.main` runs; :class:`PolicyApp`
is the :class:`~services.runtime.service.Service` it returns.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llmesh.v1 import policy_pb2_grpc

from policy import audit_key
from policy.audit import AuditLog
from policy.config import PolicySettings
from policy.memo import ScanMemo
from policy.service import PolicyService, RedisTenantRegistry
from policy.servicer import SERVICE_NAME, PolicyServicer
from policy.share import RedisRulesetShare
from policy.store import RulesetStore
from services.runtime import redis_client, versions
from services.runtime.errors import FailedPrecondition, Unavailable
from services.runtime.server import RunningServer, ServiceBinding
from services.runtime.versions import VersionStore

log = logging.getLogger(__name__)


class PolicyApp:
    """The running pieces of one policy process and their lifecycle."""

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.redis: Any = redis_client.connect(
            settings.redis_url,
            socket_connect_timeout=settings.redis_connect_timeout_s,
            socket_timeout=settings.redis_timeout_s,
        )
        self.audit = AuditLog(
            self.redis,
            hmac_key=audit_key.resolve(
                settings.audit_hmac_key.get_secret_value(), settings.audit_hmac_key_file, settings.host
            ),
            key=settings.audit_key,
            buffer_limit=settings.audit_buffer_limit,
            on_accepting_change=self._on_audit_change,
        )
        self.service = PolicyService(
            RulesetStore(settings.ruleset_path),
            self.audit,
            # Answers are stamped with the policy version: its key must outlive the cache entries
            # (every read keeps it the long TTL; services.runtime.versions).
            VersionStore(self.redis, read_ttl_s=versions.DEFAULT_TTL_S),
            RedisTenantRegistry(self.redis),
            max_text_chars=settings.max_text_chars,
            max_streams_per_call=settings.max_streams_per_call,
            max_checks_per_call=settings.max_checks_per_call,
            admin_tenants=settings.admin_tenants,
            redis_retry_s=settings.redis_retry_s,
            share=RedisRulesetShare(self.redis, settings.shared_ruleset_key),
            scan_memo=ScanMemo(settings.scan_memo_bytes),
        )
        self.servicer = PolicyServicer(self.service)
        self._server: RunningServer | None = None
        self._health_tasks: set[asyncio.Task[None]] = set()

    def binding(self) -> ServiceBinding:
        return ServiceBinding(
            name=SERVICE_NAME, add=policy_pb2_grpc.add_PolicyServiceServicer_to_server, servicer=self.servicer
        )

    async def start(self, server: RunningServer | None = None) -> None:
        """Starts the audit writer and the ruleset file watch."""
        self._server = server
        self.audit.start()
        await self.service.sync_shared()
        self.service.start_watch(self.settings.watch_interval_s)

    async def drain(self) -> None:
        """Nothing of its own to stop early: audit writes of in-flight calls still need the writer."""

    async def close(self) -> None:
        await self.service.stop_watch()
        await self.audit.close(wait_s=self.settings.grace_seconds)
        await self.redis.aclose()

    def _on_audit_change(self, accepting: bool) -> None:
        # Health follows the audit log: NOT_SERVING while decisions are refused.
        if self._server is not None:
            task = asyncio.get_running_loop().create_task(self._server.set_serving(accepting))
            self._health_tasks.add(task)
            task.add_done_callback(self._health_tasks.discard)


async def create(settings: PolicySettings) -> PolicyApp:
    """Builds the policy service (not started: :meth:`PolicyApp.start` reads the shared ruleset).

    No audit HMAC key beyond loopback: :class:`Unavailable` (the service exits 1 with one line
    saying which setting to give it; :func:`services.runtime.entry.main`)."""
    try:
        return PolicyApp(settings)
    except FailedPrecondition as exc:
        raise Unavailable(exc.message) from None
