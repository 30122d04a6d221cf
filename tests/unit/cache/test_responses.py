"""The freshness rule (pure)."""

from __future__ import annotations

from cache.domain import CacheEntry
from cache.responses import judge

ENTRY = CacheEntry(
    payload=b"x", derived_from={"session:a": 100, "policy": 50}, created_at_ms=1000, expires_at_ms=5000
)


def _floors(floors: dict[str, int]) -> object:
    return lambda ns: max(floors.get("", 0), floors.get(ns, 0))


def test_fresh_entry_reports_age() -> None:
    verdict = judge(ENTRY, 1500, _floors({}), {"session:a": 100, "policy": 50}, None)  # type: ignore[arg-type]
    assert verdict.fresh
    assert verdict.age_ms == 500


def test_floor_above_a_stamp_is_stale() -> None:
    assert not judge(ENTRY, 1500, _floors({"session:a": 101}), {}, None).fresh  # type: ignore[arg-type]
    assert judge(ENTRY, 1500, _floors({"session:a": 100}), {}, None).fresh  # type: ignore[arg-type]
    # A bare floor applies to every namespace.
    assert not judge(ENTRY, 1500, _floors({"": 60}), {}, None).fresh  # type: ignore[arg-type]


def test_namespace_moved_on_is_stale() -> None:
    verdict = judge(ENTRY, 1500, _floors({}), {"policy": 51}, None)  # type: ignore[arg-type]
    assert not verdict.fresh
    assert "policy" in verdict.reason


def test_max_age_and_ttl() -> None:
    assert not judge(ENTRY, 1500, _floors({}), {}, 500).fresh  # type: ignore[arg-type]
    assert judge(ENTRY, 1500, _floors({}), {}, 501).fresh  # type: ignore[arg-type]
    assert not judge(ENTRY, 1000, _floors({}), {}, 0).fresh  # type: ignore[arg-type]
    assert not judge(ENTRY, 5000, _floors({}), {}, None).fresh  # type: ignore[arg-type]
