"""Every service has one shape: ``<package>.app.create(settings)`` returns a runtime ``Service``,
and ``<package>.__main__`` hands that factory to the runtime's entry point under its guard."""

from __future__ import annotations

import importlib
import inspect
import runpy
import typing
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from unittest.mock import create_autospec

import pytest

from cache.config import CacheSettings
from gateway.config import GatewaySettings
from policy.config import PolicySettings
from services.embeddings.config import EmbeddingsSettings
from services.embeddings.encoder import Encoder
from services.inference.config import InferenceSettings
from services.inference.engine import VllmEngine
from services.runtime import entry
from services.runtime.cli.catalog import SERVICES
from services.runtime.server import ServiceBinding
from services.runtime.service import Service
from services.runtime.settings import ServiceSettings
from tests.fixtures.fake_inference import FakeInference, start_fake

PACKAGES = [spec.package for spec in SERVICES]


def _factory(package: str) -> Callable[..., Awaitable[Service]]:
    factory: Callable[..., Awaitable[Service]] = importlib.import_module(f"{package}.app").create
    return factory


@pytest.mark.parametrize("package", PACKAGES)
def test_app_module_has_an_async_create_taking_the_service_settings(package: str) -> None:
    factory = _factory(package)
    assert inspect.iscoroutinefunction(factory)
    hints = typing.get_type_hints(factory)
    settings_type = hints[next(iter(inspect.signature(factory).parameters))]
    assert issubclass(settings_type, ServiceSettings)
    assert settings_type.service_name == next(s.name for s in SERVICES if s.package == package)


@pytest.mark.parametrize("package", PACKAGES)
def test_main_runs_the_factory_through_the_entry_point_only_under_the_guard(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr(entry, "main", lambda settings, create: calls.append((settings, create)))
    # What a process spawned by vLLM (multiprocessing "spawn") runs: nothing may start.
    runpy.run_module(f"{package}.__main__", run_name="__mp_main__")
    assert calls == []
    runpy.run_module(f"{package}.__main__", run_name="__main__")
    [(settings, create)] = calls
    assert create is _factory(package)
    assert issubclass(settings, ServiceSettings)


async def _cache(redis_url: str) -> AsyncGenerator[Service, None]:
    from cache.app import create

    yield await create(
        CacheSettings(redis_url=redis_url, semantic_enabled=False, tokenizer_dir="/nonexistent")
    )


async def _policy(redis_url: str) -> AsyncGenerator[Service, None]:
    from policy.app import create

    yield await create(PolicySettings(redis_url=redis_url))


async def _embeddings(redis_url: str) -> AsyncGenerator[Service, None]:
    from services.embeddings.app import create

    yield await create(EmbeddingsSettings(redis_url=redis_url), create_autospec(Encoder, instance=True))


async def _inference(redis_url: str) -> AsyncGenerator[Service, None]:
    # create() would start vLLM: the app is built around a stand-in engine instead.
    from services.inference.app import InferenceApp

    yield InferenceApp(InferenceSettings(), create_autospec(VllmEngine, instance=True))


async def _gateway(redis_url: str) -> AsyncGenerator[Service, None]:
    from gateway.app import create

    replica = await start_fake(FakeInference("r1"))
    try:
        yield await create(GatewaySettings(inference_addresses=[replica.address], redis_url=redis_url))
    finally:
        await replica.stop(0)


BUILDERS: dict[str, Callable[[str], AsyncGenerator[Service, None]]] = {
    "cache": _cache,
    "policy": _policy,
    "services.embeddings": _embeddings,
    "services.inference": _inference,
    "gateway": _gateway,
}


def test_every_service_has_a_builder_here() -> None:
    assert sorted(BUILDERS) == sorted(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
async def test_what_create_returns_is_a_service(package: str, redis_url: str) -> None:
    builder = BUILDERS[package](redis_url)
    service = await anext(builder)
    try:
        assert isinstance(service, Service)
        for method in ("start", "drain", "close"):
            assert inspect.iscoroutinefunction(getattr(service, method)), method
        binding = service.binding()
        assert isinstance(binding, ServiceBinding)
        assert binding.name.startswith("llmesh.v1.")
    finally:
        await service.close()
        await builder.aclose()
