"""What the ``llmesh`` command knows about: services, benchmarks and extra subcommands.

Each entry names a module; ``tests/unit/runtime/cli/test_catalog.py`` checks that every one
resolves, so a typo fails a test instead of hiding an entry. Benchmarks live in the
source tree's ``benchmarks`` package, which service images leave out: asking for one
there is a clear error, not a missing subcommand.
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

# Services whose state is in Redis (embeddings: an in-memory index rebuilt from it), so
# several instances can serve one mesh (`llmesh up --policy-replicas N`), and how many at most.
SCALABLE = ("policy", "cache", "embeddings")
MAX_INSTANCES = 9  # instance i listens on the service's port + 100 * i

BENCHMARKS: dict[str, str] = {
    "hops": "benchmarks.hops",
    "inference": "benchmarks.inference",
    "cache": "benchmarks.cache",
    "policy": "benchmarks.policy",
    "policy-cpu": "benchmarks.policy_cpu",
    "embeddings": "benchmarks.embeddings",
    "mesh": "benchmarks.mesh",
    "quic": "benchmarks.quic.bench",
    "soak": "benchmarks.reliability.bench_soak",
    "faults": "benchmarks.reliability.bench_faults",
    "upgrade": "benchmarks.reliability.bench_upgrade",
}

# `llmesh NAME ...` → `module:function(argv) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("services.inference.model", "manage the generation model (llmesh model prepare)"),
    "audit": ("policy.audit", "verify the policy audit log (llmesh audit verify)"),
    "certs": ("services.runtime.certs", "create development certificates (llmesh certs create)"),
    "doctor": ("services.runtime.cli.doctor", "check what `llmesh up` needs, each problem with its fix"),
    "admin": ("services.runtime.cli.admin", "API keys, tenants, rulesets through the gateway's admin API"),
}


def service(name: str) -> ServiceSpec | None:
    return next((s for s in SERVICES if s.name == name), None)


class BenchmarksMissingError(RuntimeError):
    """The ``benchmarks`` package is not importable (a service image ships without it)."""


def load_benchmark(name: str) -> Callable[..., Any]:
    """``run(argv) -> BenchReport`` of benchmark ``name``."""
    if importlib.util.find_spec("benchmarks") is None:
        raise BenchmarksMissingError(
            f"benchmark {name!r} needs the source tree's benchmarks package, which this "
            "installation leaves out: run it from a checkout (bash scripts/install.sh)"
        )
    return load(BENCHMARKS[name], "run")


def load(module: str, attribute: str) -> Callable[..., Any]:
    fn = getattr(importlib.import_module(module), attribute)
    if not callable(fn):
        raise TypeError(f"{module}.{attribute} is not callable")
    return fn  # type: ignore[no-any-return]
