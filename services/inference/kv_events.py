"""The engine's KV-cache events, read into :class:`KvHoldings` and fanned out to watchers.

vLLM's engine process publishes its KV-cache events on a ZMQ PUB socket (here an
``ipc://`` socket in a private directory, so nothing outside this replica can read or
inject them). :class:`KvEventFeed` subscribes in the service's event loop, applies each
batch to a :class:`~services.inference.kv_holdings.KvHoldings`, and hands the resulting
changes to every ``WatchPrefixes`` stream. A gap in the publisher's sequence numbers
(the socket dropped events under load) resets the map, and every watcher starts over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from services.inference.kv_holdings import Changes, Cleared, Event, KvHoldings, Removed, Stored
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

EVENT_BATCHES = Counter(
    "llmesh_inference_kv_event_batches_total", "KV-cache event batches read from the engine."
)
RESETS = Counter(
    "llmesh_inference_kv_event_resets_total",
    "Times the replica lost track of its KV cache (a gap in the engine's events, a cleared cache).",
)
HELD_KEYS = Gauge("llmesh_inference_kv_held_prefixes", "Routers' prefix keys this replica's KV cache holds.")
# A watcher this far behind gets a fresh snapshot instead of its backlog.
WATCH_BACKLOG = 256


@dataclass(frozen=True, slots=True)
class Update:
    """One message of a WatchPrefixes stream."""

    reset: bool
    held: Sequence[int]
    released: Sequence[int]
    blocks_held: int
    blocks_total: int


def convert_event(event: Any) -> Event | None:
    """vLLM's event struct as ours (None: an event kind or medium this map ignores)."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    if isinstance(event, BlockStored):
        if (
            event.medium not in (None, "GPU")
            or event.group_idx not in (None, 0)
            or event.lora_id is not None
            or any(extra for extra in event.extra_keys or ())
        ):
            return None  # offloaded tiers, other layer groups, LoRA and salted blocks: not by tokens alone
        return Stored(
            tuple(event.block_hashes), event.parent_block_hash, tuple(event.token_ids), event.block_size
        )
    if isinstance(event, BlockRemoved):
        if event.medium not in (None, "GPU") or event.group_idx not in (None, 0):
            return None
        return Removed(tuple(event.block_hashes))
    if isinstance(event, AllBlocksCleared):
        return Cleared()
    return None


class _Watcher:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Changes] = asyncio.Queue(WATCH_BACKLOG)
        self.overflowed = False


class KvEventFeed:
    """Subscribes to the engine's KV events; keeps the holdings; serves watchers."""

    def __init__(self, endpoint: str, holdings: KvHoldings, blocks_total: int) -> None:
        self.endpoint = endpoint
        self.holdings = holdings
        self.blocks_total = blocks_total
        self._watchers: set[_Watcher] = set()
        self._task: asyncio.Task[None] | None = None
        self._socket: Any = None
        self._last_seq: int | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        self._socket = context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.RCVHWM, 100_000)
        self._socket.connect(self.endpoint)
        self._task = asyncio.create_task(self._read(), name="kv events")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._socket is not None:
            self._socket.close(linger=0)

    async def _read(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while True:
            frames = await self._socket.recv_multipart()
            self.connected.set()
            if len(frames) != 3:
                continue
            _, seq_bytes, payload = frames
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if self._last_seq is not None and seq != self._last_seq + 1:
                log.warning("KV events %d..%d lost: the prefix map starts over", self._last_seq + 1, seq - 1)
                RESETS.inc()
                self.holdings.clear()
            self._last_seq = seq
            try:
                batch = decoder.decode(payload)
            except msgspec.DecodeError:
                log.exception("undecodable KV event batch %d: the prefix map starts over", seq)
                RESETS.inc()
                self.holdings.clear()
                self._publish()
                continue
            EVENT_BATCHES.inc()
            events = [e for e in (convert_event(raw) for raw in batch.events) if e is not None]
            if any(isinstance(e, Cleared) for e in events):
                RESETS.inc()
            self.holdings.apply(events)
            self._publish()

    def expect(
        self, keys: Sequence[int], block_chars: int, text_chars: int, prompt_token_ids: Sequence[int]
    ) -> None:
        """A request with these keys reached the engine (see :meth:`KvHoldings.expect`)."""
        self.holdings.expect(keys, block_chars, text_chars, prompt_token_ids)
        self._publish()

    def _publish(self) -> None:
        changes = self.holdings.take_changes()
        if changes is None:
            return
        HELD_KEYS.set(self.holdings.held_count)
        for watcher in self._watchers:
            if watcher.overflowed:
                continue
            try:
                watcher.queue.put_nowait(changes)
            except asyncio.QueueFull:
                watcher.overflowed = True

    def _snapshot(self, reset: bool = True) -> Update:
        return Update(reset, sorted(self.holdings.held_keys()), [], self.holdings.blocks, self.blocks_total)

    async def watch(self) -> AsyncIterator[Update]:
        """A snapshot, then every change, until the caller stops iterating."""
        watcher = _Watcher()
        self._watchers.add(watcher)
        try:
            yield self._snapshot()
            while True:
                changes = await watcher.queue.get()
                if watcher.overflowed:
                    # Too far behind: the backlog is dropped and replaced by the current state.
                    watcher.overflowed = False
                    while not watcher.queue.empty():
                        watcher.queue.get_nowait()
                    yield self._snapshot()
                    continue
                if changes.reset:
                    yield self._snapshot()
                    continue
                yield Update(
                    False,
                    sorted(changes.held),
                    sorted(changes.released),
                    self.holdings.blocks,
                    self.blocks_total,
                )
        finally:
            with contextlib.suppress(KeyError):
                self._watchers.remove(watcher)
