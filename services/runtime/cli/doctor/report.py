"""What a check reports (:class:`Result`) about what ``llmesh up`` would start (:class:`Target`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from services.runtime.cli import catalog

GIB = 1 << 30


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Result:
    """One check's verdict: what it found and, unless ok, what to do about it."""

    status: Status
    detail: str
    fix: str = ""
    name: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class Target:
    """What ``llmesh up`` would start, from the same options with the same defaults."""

    only: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port_offset: int = 0
    replicas: int = 1
    instances: Mapping[str, int] = field(default_factory=dict)

    @property
    def services(self) -> list[str]:
        return [s.name for s in catalog.SERVICES if not self.only or s.name in self.only]
