"""Gateway-local copies (gateway/local_cache.py) against a watch whose pushes the test makes."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from gateway.local_cache import LocalCopies, digest
from services.runtime.invalidations import Listener, Mark
from services.runtime.versions import version_key


class FakeWatch:
    """The VersionWatch surface LocalCopies uses; pushes and barriers are the test's to give."""

    def __init__(self) -> None:
        self.epoch, self.seq, self.connected = 1, 0, True
        self.last: dict[str, int] = {}
        self.listeners: list[Listener] = []
        self.barrier_ok = True
        self.during_barrier: list[str] | None = None

    def subscribe(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def mark(self) -> Mark | None:
        return Mark(self.epoch, self.seq) if self.connected else None

    def changed_since(self, mark: Mark, keys: Iterable[str]) -> bool:
        if not self.connected or mark.epoch != self.epoch:
            return True
        return any(self.last.get(k, 0) > mark.seq for k in keys)

    def push(self, keys: list[str] | None) -> None:
        self.seq += 1
        if keys is None:
            self.epoch += 1
        else:
            for k in keys:
                self.last[k] = self.seq
        for listener in self.listeners:
            listener(keys)

    async def barrier(self) -> bool:
        if self.during_barrier is not None:
            self.push(self.during_barrier)
        return self.barrier_ok and self.connected


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def no_floor(namespace: str) -> int:
    return 0


@pytest.fixture
def parts() -> tuple[FakeWatch, Clock, LocalCopies[str]]:
    watch, clock = FakeWatch(), Clock()
    copies: LocalCopies[str] = LocalCopies(watch, max_bytes=1000, tenant_bytes=400, clock=clock)  # type: ignore[arg-type]
    return watch, clock, copies


def put(
    copies: LocalCopies[str], tenant: str, key: bytes, value: str, *, size: int = 10, **kw: object
) -> bool:
    args: dict[str, object] = {
        "stamps": {"tenant": 5, "rag:kb": 7},
        "mark": copies.watch.mark(),
        "t0": copies._clock(),
        "age_ms": 20,
        "ttl_ms": 60_000,
        "size": size,
    }
    args.update(kw)
    return copies.put(tenant, key, value, **args)  # type: ignore[arg-type]


async def test_a_copy_is_served_with_an_age_that_is_never_understated(
    parts: tuple[FakeWatch, Clock, LocalCopies[str]],
) -> None:
    _, clock, copies = parts
    assert put(copies, "a", b"k", "answer")
    clock.now += 0.5
    found = await copies.get("a", b"k", no_floor, None)
    assert found is not None
    copy, age = found
    assert copy.value == "answer" and age == 520
    assert await copies.get("b", b"k", no_floor, None) is None  # another tenant has no copy


async def test_a_push_of_any_version_it_depends_on_drops_it(
    parts: tuple[FakeWatch, Clock, LocalCopies[str]],
) -> None:
    watch, _, copies = parts
    put(copies, "a", b"k1", "one")
    put(copies, "a", b"k2", "two", stamps={"tenant": 5})
    put(copies, "b", b"k1", "other tenant")
    watch.push([version_key("a", "rag:kb")])
    assert await copies.get("a", b"k1", no_floor, None) is None
    assert await copies.get("a", b"k2", no_floor, None) is not None
    assert await copies.get("b", b"k1", no_floor, None) is not None
    watch.push(None)  # a flush or a lost connection: everything goes
    assert len(copies) == 0 and copies.size == 0


async def test_a_push_during_the_barrier_is_applied_before_serving(
    parts: tuple[FakeWatch, Clock, LocalCopies[str]],
) -> None:
    watch, _, copies = parts
    put(copies, "a", b"k", "answer")
    watch.during_barrier = [version_key("a", "tenant")]
    assert await copies.get("a", b"k", no_floor, None) is None


async def test_no_barrier_no_hit(parts: tuple[FakeWatch, Clock, LocalCopies[str]]) -> None:
    watch, _, copies = parts
    put(copies, "a", b"k", "answer")
    watch.barrier_ok = False
    assert await copies.get("a", b"k", no_floor, None) is None


async def test_what_changed_during_the_read_is_not_kept(
    parts: tuple[FakeWatch, Clock, LocalCopies[str]],
) -> None:
    watch, _, copies = parts
    mark = watch.mark()
    watch.push([version_key("a", "rag:kb")])  # between the mark and the reply
    assert not put(copies, "a", b"k", "answer", mark=mark)
    watch.push([version_key("a", "unrelated")])
    assert put(copies, "a", b"k", "answer")
    watch.connected = False
    assert not put(copies, "a", b"k2", "answer")  # no mark without the connection


async def test_floors_max_age_and_lifetime_send_the_request_to_the_cache(
    parts: tuple[FakeWatch, Clock, LocalCopies[str]],
) -> None:
    _, clock, copies = parts
    put(copies, "a", b"k", "answer", ttl_ms=1000)
    assert await copies.get("a", b"k", lambda ns: 8 if ns == "rag:kb" else 0, None) is None
    assert await copies.get("a", b"k", lambda ns: 7 if ns == "rag:kb" else 0, None) is not None
    assert await copies.get("a", b"k", no_floor, 0) is None  # max-age 0: never a hit
    assert await copies.get("a", b"k", no_floor, 20) is None  # aged 20 ms: not below 20
    assert await copies.get("a", b"k", no_floor, 21) is not None
    clock.now += 1.0
    assert await copies.get("a", b"k", no_floor, None) is None  # outlived the cache's entry
    assert len(copies) == 0


def test_bytes_are_bounded_per_tenant_and_in_all(parts: tuple[FakeWatch, Clock, LocalCopies[str]]) -> None:
    _, _, copies = parts
    for i in range(5):
        assert put(copies, "a", bytes([i]), "x", size=100)
    assert copies.size == 400  # tenant a holds at most 400: its oldest went first
    assert copies.peek("a", bytes([0]), no_floor, None) is None
    assert copies.peek("a", bytes([4]), no_floor, None) is not None
    for tenant in "bcd":
        for i in range(3):
            put(copies, tenant, bytes([i]), "x", size=100)
    assert copies.size <= 1000
    assert not put(copies, "a", b"big", "x", size=401)  # larger than a tenant may hold


def test_digest_separates_its_parts() -> None:
    assert digest(b"ab", b"c") != digest(b"a", b"bc")
    assert len(digest(b"x")) == 20
