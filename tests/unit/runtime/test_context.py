from __future__ import annotations

import pytest

from services.runtime import context as rc
from services.runtime.errors import InvalidArgument


def test_parse_versions_bare_and_namespaced() -> None:
    assert rc.parse_versions("7") == {"": 7}
    assert rc.parse_versions("session:a=3, rag:docs=9,5") == {"session:a": 3, "rag:docs": 9, "": 5}
    assert rc.parse_versions("policy=2,policy=8") == {"policy": 8}  # duplicates keep the max


def test_format_round_trips() -> None:
    versions = {"": 4, "session:x=y": 11, "rag:b": 2, "ns,with\x1f%ctl": 3, "rag:日本": 5}
    header = rc.format_versions(versions)
    assert header.isascii() and header.isprintable()
    assert rc.parse_versions(header) == versions


@pytest.mark.parametrize("value", ["-1", "x", "a=-2", "=3", "1.5", "a=", "٣"])
def test_bad_versions_name_the_key(value: str) -> None:
    with pytest.raises(InvalidArgument, match="x-llmesh-cache-version"):
        rc.parse_versions(value)


def test_floor_for_takes_the_stricter_floor() -> None:
    ctx = rc.new_context(floors={"": 10, "session:a": 20})
    assert ctx.floor_for("session:a") == 20
    assert ctx.floor_for("rag:docs") == 10


def test_from_metadata_defaults_and_fields() -> None:
    ctx = rc.from_metadata([], None)
    # An incoming call that names no tenant has none: it is never served as the default tenant.
    assert len(ctx.request_id) == 32 and ctx.tenant == rc.NO_TENANT and ctx.deadline is None
    assert not any(key == rc.TENANT for key, _ in ctx.outgoing_metadata())
    ctx = rc.from_metadata(
        [("x-llmesh-max-age", "0"), ("x-llmesh-no-store", "true"), ("x-llmesh-semantic", "off")], 2.0
    )
    assert ctx.max_age_ms == 0 and ctx.no_store and not ctx.semantic
    remaining = ctx.time_remaining()
    assert remaining is not None and 1.0 < remaining <= 2.0


def test_trailers_merge_floors_observed_and_status() -> None:
    ctx = rc.new_context(floors={"session:a": 5})
    ctx.observe("session:a", 3)
    ctx.observe("rag:d", 9)
    ctx.set_cache_status("HIT", 40)
    trailers = dict(ctx.trailing_metadata())
    assert rc.parse_versions(trailers[rc.CACHE_VERSION]) == {"session:a": 5, "rag:d": 9}
    assert trailers[rc.CACHE_STATUS] == "HIT" and trailers[rc.AGE] == "40"


def test_absorb_ignores_broken_downstream_headers() -> None:
    ctx = rc.new_context()
    ctx.absorb_trailers([(rc.CACHE_VERSION, "bogus"), (rc.CACHE_STATUS, "WEIRD"), (rc.AGE, "x")])
    assert ctx.observed == {} and ctx.cache_status is None and ctx.age_ms is None
    ctx.absorb_trailers([(rc.CACHE_VERSION, "a=4"), (rc.CACHE_STATUS, "STALE"), (rc.AGE, "7")])
    assert ctx.observed == {"a": 4} and ctx.cache_status == "STALE" and ctx.age_ms == 7


def test_set_cache_status_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="unknown cache status"):
        rc.new_context().set_cache_status("MAYBE")


def test_extra_trailers_are_returned_and_checked() -> None:
    ctx = rc.new_context()
    ctx.add_trailer("x-llmesh-response-sha256", "ab" * 32)
    assert ("x-llmesh-response-sha256", "ab" * 32) in ctx.trailing_metadata()
    with pytest.raises(ValueError, match="lowercase"):
        ctx.add_trailer("X-Upper", "v")
    with pytest.raises(ValueError, match="printable"):
        ctx.add_trailer("x-ok", "line\nbreak")


def test_set_trailer_replaces_and_keeps_the_others() -> None:
    ctx = rc.new_context()
    ctx.add_trailer("x-a", "1")
    ctx.set_trailer("x-llmesh-resumed", "1")
    ctx.set_trailer("x-llmesh-resumed", "2")
    assert ctx.trailer("x-llmesh-resumed") == "2" and ctx.trailer("x-missing") is None
    assert ctx.extra_trailers == [("x-a", "1"), ("x-llmesh-resumed", "2")]
    with pytest.raises(ValueError, match="printable"):
        ctx.set_trailer("x-llmesh-resumed", "line\nbreak")
    assert ctx.extra_trailers == [("x-a", "1"), ("x-llmesh-resumed", "2")]  # a refused value changes nothing
