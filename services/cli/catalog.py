"""What the ``llmesh`` command knows about: services, benchmarks and extra subcommands.

Each entry names a module; an entry whose module is not in the tree (a service
not built yet) is simply left out, so nothing is ever listed as a placeholder.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    package: str
    port: int
    env_prefix: str
    # Seconds `llmesh up` waits for the health check (the inference engine loads a model).
    start_timeout_s: float = 60.0


# In start order: the gateway comes last because it needs the others.
SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec("cache", "cache", 50053, "LLMESH_CACHE_"),
    ServiceSpec("policy", "policy", 50052, "LLMESH_POLICY_"),
    ServiceSpec("embeddings", "services.embeddings", 50054, "LLMESH_EMBEDDINGS_", 120.0),
    ServiceSpec("inference", "services.inference", 50051, "LLMESH_INFERENCE_", 300.0),
    ServiceSpec("gateway", "gateway", 50050, "LLMESH_GATEWAY_"),
)

BENCHMARKS: dict[str, str] = {
    "hops": "services.runtime.bench_hops",
    "inference": "services.inference.bench",
    "cache": "cache.bench",
    "policy": "policy.bench",
    "embeddings": "services.embeddings.bench",
    "mesh": "gateway.bench",
    "quic": "services.runtime.quic.bench",
    "soak": "services.reliability.bench_soak",
    "faults": "services.reliability.bench_faults",
    "upgrade": "services.reliability.bench_upgrade",
}

# `llmesh NAME ...` → `module:function(argv) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("services.inference.model", "manage the generation model (llmesh model prepare)"),
    "audit": ("policy.audit", "verify the policy audit log (llmesh audit verify)"),
    "certs": ("services.runtime.certs", "create development certificates (llmesh certs create)"),
}


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def available_services() -> list[ServiceSpec]:
    return [s for s in SERVICES if module_exists(f"{s.package}.__main__")]


def service(name: str) -> ServiceSpec | None:
    return next((s for s in available_services() if s.name == name), None)


def available_benchmarks() -> dict[str, str]:
    return {name: module for name, module in BENCHMARKS.items() if module_exists(module)}


def available_commands() -> dict[str, tuple[str, str]]:
    return {name: entry for name, entry in COMMANDS.items() if module_exists(entry[0])}


def load(module: str, attribute: str) -> Callable[..., Any]:
    fn = getattr(importlib.import_module(module), attribute)
    if not callable(fn):
        raise TypeError(f"{module}.{attribute} is not callable")
    return fn  # type: ignore[no-any-return]
