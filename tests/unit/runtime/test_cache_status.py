"""One cache status across the proto enum, the trailers and the cache's lookups."""

from __future__ import annotations

import pytest
from llmesh.v1 import common_pb2

from cache.domain import Status
from services.runtime import context as rc
from services.runtime.cache_status import CacheStatus, status_pb


@pytest.mark.parametrize("status", list(CacheStatus))
def test_round_trips_through_the_proto_enum(status: CacheStatus) -> None:
    pb = status.to_pb()
    assert common_pb2.CacheStatus.Name(pb) == f"CACHE_STATUS_{status.value}"
    assert CacheStatus.from_pb(pb) is status


def test_every_proto_value_but_unspecified_has_a_member() -> None:
    values = set(common_pb2.CacheStatus.values()) - {common_pb2.CACHE_STATUS_UNSPECIFIED}
    assert {s.to_pb() for s in CacheStatus} == values
    assert CacheStatus.from_pb(common_pb2.CACHE_STATUS_UNSPECIFIED) is None


def test_status_pb_of_none_is_unspecified() -> None:
    assert status_pb(None) == common_pb2.CACHE_STATUS_UNSPECIFIED
    assert status_pb(CacheStatus.STALE) == common_pb2.CACHE_STATUS_STALE


def test_the_value_is_the_header_text() -> None:
    assert CacheStatus.HIT == "HIT" and str(CacheStatus.BYPASS) == "BYPASS"
    assert Status is CacheStatus  # the cache's domain uses the same enum


def test_context_keeps_a_member_and_sends_its_text() -> None:
    ctx = rc.new_context()
    ctx.set_cache_status("MISS")
    assert ctx.cache_status is CacheStatus.MISS
    assert (rc.CACHE_STATUS, "MISS") in ctx.trailing_metadata()
    other = rc.new_context()
    other.absorb_trailers(ctx.trailing_metadata())
    assert other.cache_status is CacheStatus.MISS
    with pytest.raises(ValueError, match="unknown cache status"):
        ctx.set_cache_status("MAYBE")
