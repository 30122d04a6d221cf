"""A service's start-up heap frozen out of the cyclic collector's reach (``telemetry.freeze_heap``)."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import REGISTRY

from services.runtime import telemetry
from services.runtime.settings import ServiceSettings


def test_freeze_heap_takes_what_is_alive_out_of_collections_and_reports_it() -> None:
    alive = [[i] for i in range(1000)]
    try:
        frozen = telemetry.freeze_heap()
        assert frozen == gc.get_freeze_count() >= len(alive)
        assert REGISTRY.get_sample_value("llmesh_gc_frozen_objects") == frozen
        # A collection walks the generations only: the frozen objects are in none of them.
        assert not any(obj is alive[0] for obj in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(obj is alive[0] for obj in gc.get_objects())


def test_freezing_is_on_by_default_and_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServiceSettings().gc_freeze is True
    monkeypatch.setenv("LLMESH_GC_FREEZE", "false")
    assert ServiceSettings().gc_freeze is False
