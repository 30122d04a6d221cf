"""Settings shared by every service (pydantic-settings).

Each service subclasses :class:`ServiceSettings` with its own env prefix
(``LLMESH_<SERVICE>_``). Precedence, highest first: constructor arguments,
environment variables, the service's section of the YAML file named by
``LLMESH_CONFIG`` (e.g. ``inference: {port: 50051}``), then the defaults, which
run on one CPU machine.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def data_dir() -> Path:
    """Where llmesh keeps prepared models and other state (``LLMESH_DATA_DIR``)."""
    default = Path.home() / ".local" / "share" / "llmesh"
    return Path(os.environ.get("LLMESH_DATA_DIR") or default).expanduser()


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # another name, or "" (every interface)


def redis_url() -> str:
    """The Redis every service shares unless its own setting says otherwise (``REDIS_URL``)."""
    return os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


class YamlSection(PydanticBaseSettingsSource):
    """Reads the service's section of the ``LLMESH_CONFIG`` YAML file."""

    def __init__(self, settings_cls: type[BaseSettings], section: str) -> None:
        super().__init__(settings_cls)
        self._data: dict[str, Any] = {}
        path = os.environ.get("LLMESH_CONFIG")
        if path:
            with open(path, encoding="utf-8") as fh:
                document = yaml.safe_load(fh) or {}
            if not isinstance(document, dict):
                raise ValueError(f"{path}: top level must be a mapping of service names")
            section_data = document.get(section) or {}
            if not isinstance(section_data, dict):
                raise ValueError(f"{path}: section {section!r} must be a mapping")
            self._data = section_data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return {k: v for k, v in self._data.items() if k in self.settings_cls.model_fields}


class SectionSettings(BaseSettings):
    """Settings read from the constructor, then the environment, then the YAML section named
    ``service_name`` (no ``.env`` files, no secret directories)."""

    service_name: ClassVar[str] = "service"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        section = getattr(settings_cls, "service_name", "service")
        return (init_settings, env_settings, YamlSection(settings_cls, section))


class ServiceSettings(SectionSettings):
    """What every gRPC service has: where it listens and how it drains."""

    model_config = SettingsConfigDict(env_prefix="LLMESH_", extra="ignore")
    # Name of the YAML section and of the service in metrics and logs.
    service_name: ClassVar[str] = "service"

    host: str = "127.0.0.1"
    port: int = 0
    # Prometheus /metrics side port; 0 = pick a free one, -1 = off.
    metrics_port: int = -1
    # Seconds in-flight calls get to finish after SIGTERM.
    grace_seconds: float = 10.0
    # After SIGTERM the service reports NOT_SERVING (the gateway: /readyz 503) but keeps
    # accepting calls until none has arrived for drain_quiet_s (clients and balancers have
    # seen it), at most drain_delay_s; only then does it refuse new calls.
    drain_quiet_s: float = 0.3
    drain_delay_s: float = 5.0
    max_message_bytes: int = 16 * 1024 * 1024
    keepalive_time_ms: int = 30_000
    keepalive_timeout_ms: int = 10_000
    max_concurrent_streams: int = 1000
    # Each client connection is closed (GOAWAY) after about max_connection_age_s, so clients of a
    # dns:/// target re-resolve and spread over replicas added since; calls in flight on it get
    # max_connection_age_grace_s more (longer than any stream). 0 = connections live forever.
    max_connection_age_s: float = 300.0
    max_connection_age_grace_s: float = 600.0
    # UDP port of the QUIC endpoint for quic:// clients in other zones; 0 = off (services.runtime.quic).
    quic_port: int = 0
    # gRPC server reflection (grpcurl list/describe); the production overlays set it false.
    reflection: bool = True
    # Secret that authorises the service's admin methods (policy ReloadRules), sent as
    # "authorization: Bearer <token>"; empty: only the "admin" certificate identity (mTLS) may
    # call them (services.runtime.authz).
    admin_token: SecretStr = SecretStr("")
    log_level: str = "INFO"
    log_json: bool = True
    # The asyncio event loop the process runs on: "uvloop" (libuv; a little less CPU per request,
    # BENCHMARKS.md "mesh: lean hit path, cheap tokens, TTFT split") or Python's own "asyncio".
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # Once started (models, rules, engines loaded), everything alive is moved out of the cyclic
    # garbage collector's reach (gc.freeze): its full collections then walk only what serving
    # allocated, instead of holding the event loop 20-290 ms on a start-up heap of 0.1-0.7
    # million objects (BENCHMARKS.md, "mesh: every section in one run with c16 in short rounds,
    # and start-up heaps frozen").
    gc_freeze: bool = True

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def shutdown_seconds(self, grace_phases: int = 1) -> float:
        """The longest a SIGTERM takes to exit: the drain's delay, then ``grace_seconds`` for each
        phase that waits on its own (the gateway: gRPC, then HTTP streams; policy: calls, then
        the audit flush). An orchestrator's kill timeout must be longer."""
        return self.drain_delay_s + grace_phases * self.grace_seconds
