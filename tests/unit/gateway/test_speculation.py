"""gateway/speculation.py on plain async generators: what a kept speculation streams, when it
gives up, and that cancelling closes the generation (its ``finally`` runs, as an engine abort)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from gateway.speculation import Speculation, SpeculationGate


class Source:
    def __init__(self, items: list[int], *, hold: asyncio.Event | None = None, fail: bool = False) -> None:
        self.items, self.hold, self.fail = items, hold, fail
        self.closed = False
        self.finished = asyncio.Event()

    async def stream(self) -> AsyncGenerator[int, None]:
        try:
            for i, item in enumerate(self.items):
                if self.fail:
                    raise RuntimeError("replica failed")
                yield item
                if i == 0 and self.hold is not None:
                    await self.hold.wait()
        finally:
            self.closed = True
            self.finished.set()


async def test_a_kept_speculation_streams_every_message_from_the_first() -> None:
    source = Source([1, 2, 3])
    speculation = Speculation(source.stream(), grace_s=10)
    await asyncio.sleep(0)  # the first message is read ahead
    assert speculation.settle()
    assert [m async for m in speculation.messages()] == [1, 2, 3]
    assert source.closed


async def test_a_lookup_out_past_the_grace_after_the_first_message_stops_the_generation() -> None:
    source = Source([1, 2, 3], hold=asyncio.Event())
    speculation = Speculation(source.stream(), grace_s=0.01)
    await asyncio.wait_for(source.finished.wait(), 5)
    assert speculation.abandoned and not speculation.settle()
    await speculation.cancel()


async def test_a_lookup_answered_within_the_grace_keeps_it() -> None:
    hold = asyncio.Event()
    source = Source([1, 2, 3], hold=hold)
    speculation = Speculation(source.stream(), grace_s=0.05)
    await asyncio.sleep(0.01)
    assert speculation.settle()
    await asyncio.sleep(0.08)  # past the grace: settled, so nothing gives up
    hold.set()
    assert [m async for m in speculation.messages()] == [1, 2, 3]


async def test_cancel_closes_the_generation_and_may_be_repeated() -> None:
    source = Source([1, 2], hold=asyncio.Event())
    speculation = Speculation(source.stream(), grace_s=10)
    await asyncio.sleep(0)
    await speculation.cancel()
    await speculation.cancel()
    assert source.closed


async def test_an_error_of_the_generation_is_raised_where_it_is_read() -> None:
    speculation = Speculation(Source([1], fail=True).stream(), grace_s=10)
    await asyncio.sleep(0)
    assert speculation.settle()
    with pytest.raises(RuntimeError, match="replica failed"):
        [m async for m in speculation.messages()]


def test_the_gate_closes_while_lookups_hit_and_opens_again_on_misses() -> None:
    gate = SpeculationGate(min_miss_ratio=0.5, weight=0.1)
    assert gate.open()
    hits = 0
    while gate.open():
        gate.record(missed=False)
        hits += 1
    assert hits == 7  # 0.9 ** 7 < 0.5
    while not gate.open():
        gate.record(missed=True)
    assert not SpeculationGate(enabled=False).open()
