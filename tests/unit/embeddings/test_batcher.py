"""Dynamic batching: coalescing, ordering, limits, failures, cancellation, shutdown."""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Sequence

import numpy as np
import pytest

from services.embeddings.batcher import DynamicBatcher
from services.embeddings.encoder import Encoded
from services.runtime.errors import ResourceExhausted, Unavailable


def vector_of(text: str) -> np.ndarray:
    return np.full(4, zlib.crc32(text.encode()) % 1000, dtype=np.float32)


class FakeModel:
    """Records batches; can be held so that callers pile up behind a busy model."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self, texts: Sequence[str]) -> Encoded:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(5)
        self.batches.append(list(texts))
        if self.fail:
            raise RuntimeError("model exploded")
        return Encoded(np.stack([vector_of(t) for t in texts]), [len(t) for t in texts])


async def test_concurrent_callers_share_batches_and_get_their_own_vectors() -> None:
    model = FakeModel()
    batcher = DynamicBatcher(model, max_batch=16, max_wait_s=0.05)
    texts = [f"text {i}" for i in range(64)]
    results = await asyncio.gather(*(batcher.embed([t]) for t in texts))
    for text, result in zip(texts, results, strict=True):
        np.testing.assert_array_equal(result.vectors[0], vector_of(text))
        assert result.token_counts == [len(text)]
    assert all(len(b) <= 16 for b in model.batches)
    assert len(model.batches) < len(texts)  # coalesced
    assert sorted(t for b in model.batches for t in b) == sorted(texts)
    assert model.threads and not any(name == threading.current_thread().name for name in model.threads)
    await batcher.close()


async def test_callers_queue_behind_a_busy_model_and_form_the_next_batch() -> None:
    model = FakeModel()
    batcher = DynamicBatcher(model, max_batch=8, max_wait_s=0.0)
    model.gate.clear()
    first = asyncio.ensure_future(batcher.embed(["first"]))
    assert await asyncio.to_thread(model.entered.wait, 5)  # the first batch is in the model
    rest = [asyncio.ensure_future(batcher.embed([f"t{i}"])) for i in range(6)]
    await asyncio.sleep(0)
    model.gate.set()
    await asyncio.gather(first, *rest)
    assert model.batches == [["first"], [f"t{i}" for i in range(6)]]
    await batcher.close()


async def test_large_request_is_split_and_reassembled_in_order() -> None:
    model = FakeModel()
    batcher = DynamicBatcher(model, max_batch=10, max_wait_s=0.0)
    texts = [f"doc {i}" for i in range(35)]
    result = await batcher.embed(texts)
    assert result.vectors.shape == (35, 4)
    for i, text in enumerate(texts):
        np.testing.assert_array_equal(result.vectors[i], vector_of(text))
    assert [len(b) for b in model.batches] == [10, 10, 10, 5]
    await batcher.close()


async def test_full_queue_is_resource_exhausted() -> None:
    batcher = DynamicBatcher(FakeModel(), max_batch=4, max_queued=5)
    with pytest.raises(ResourceExhausted, match="queue is full"):
        await batcher.embed([f"t{i}" for i in range(6)])
    await batcher.close()


async def test_model_failure_reaches_every_caller_of_the_batch_and_the_batcher_survives() -> None:
    model = FakeModel()
    batcher = DynamicBatcher(model, max_batch=8, max_wait_s=0.05)
    model.fail = True
    results = await asyncio.gather(*(batcher.embed([f"t{i}"]) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    model.fail = False
    ok = await batcher.embed(["after"])
    np.testing.assert_array_equal(ok.vectors[0], vector_of("after"))
    await batcher.close()


async def test_cancelled_caller_is_not_computed() -> None:
    model = FakeModel()
    batcher = DynamicBatcher(model, max_batch=1, max_wait_s=0.0)
    model.gate.clear()
    busy = asyncio.ensure_future(batcher.embed(["busy"]))
    assert await asyncio.to_thread(model.entered.wait, 5)
    doomed = asyncio.ensure_future(batcher.embed(["doomed"]))
    await asyncio.sleep(0)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    model.gate.set()
    await busy
    await batcher.embed(["later"])
    assert ["doomed"] not in model.batches
    assert batcher.queued_texts == 0
    await batcher.close()


async def test_closed_batcher_is_unavailable() -> None:
    batcher = DynamicBatcher(FakeModel())
    await batcher.embed(["x"])
    await batcher.close()
    with pytest.raises(Unavailable):
        await batcher.embed(["y"])
