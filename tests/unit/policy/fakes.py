"""Fakes behind the policy service's Protocols (Redis script, versions, tenant registry, audit sink)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policy.audit import AuditRecord


class FakeScriptRedis:
    """Just enough of redis.asyncio for AuditLog: register_script, with a switch to fail."""

    def __init__(self) -> None:
        self.down = False
        self.entries: list[tuple[str, dict[str, str]]] = []
        self.heads: dict[str, str] = {}
        self.calls = 0

    def register_script(self, source: str) -> Any:
        async def run(keys: list[str], args: list[Any]) -> int:
            self.calls += 1
            if self.down:
                raise ConnectionError("redis is down")
            chain = str(args[0])
            last = int(self.heads.get(chain, "0:").split(":")[0])
            for i in range(1, len(args), 3):
                seq = int(args[i])
                if seq > last:
                    fields = {
                        "chain": chain,
                        "seq": str(seq),
                        "hash": str(args[i + 1]),
                        "record": str(args[i + 2]),
                    }
                    self.entries.append((f"{len(self.entries) + 1}-0", fields))
                    self.heads[chain] = f"{seq}:{args[i + 1]}"
                    last = seq
            return last

        return run


@dataclass
class FakeVersions:
    values: dict[tuple[str, str], int] = field(default_factory=dict)
    fail: bool = False
    bumps: list[str] = field(default_factory=list)

    async def bump(self, tenant: str, namespace: str) -> int:
        if self.fail:
            raise ConnectionError("redis is down")
        self.bumps.append(tenant)
        value = self.values.get((tenant, namespace), 100) + 1
        self.values[(tenant, namespace)] = value
        return value

    async def get(self, tenant: str, namespace: str) -> int:
        if self.fail:
            raise ConnectionError("redis is down")
        return self.values.setdefault((tenant, namespace), 100)


@dataclass
class FakeTenants:
    known: set[str] = field(default_factory=set)

    async def add(self, tenant: str) -> None:
        self.known.add(tenant)

    async def all(self) -> set[str]:
        return set(self.known)


@dataclass
class FakeAudit:
    records: list[AuditRecord] = field(default_factory=list)
    accepting: bool = True

    def append(self, record: AuditRecord) -> None:
        self.records.append(record)


@dataclass
class FakeShare:
    """The shared-ruleset hash, in memory; several services may share one."""

    value: tuple[str, str] | None = None
    down: bool = False

    async def publish(self, yaml_text: str, digest: str) -> None:
        if self.down:
            raise ConnectionError("redis is down")
        self.value = (yaml_text, digest)

    async def clear(self) -> None:
        if self.down:
            raise ConnectionError("redis is down")
        self.value = None

    async def digest(self) -> str | None:
        if self.down:
            raise ConnectionError("redis is down")
        return None if self.value is None else self.value[1]

    async def fetch(self) -> tuple[str, str] | None:
        return self.value


def small_ruleset(version: str, extra: str = "") -> str:
    """A one-rule ruleset (keyword ``forbidden`` blocked both ways) for reload tests."""
    return (
        f"version: {version}\n"
        "rules:\n"
        "  - id: words\n"
        "    detector: keyword\n"
        "    scope: both\n"
        "    action: block\n"
        "    options: {keywords: [forbidden]}\n"
    ) + extra
