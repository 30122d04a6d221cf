"""Which of the routers' prefix keys this replica's KV cache holds (pure: no I/O, no vLLM).

The engine publishes a KV-cache event for every block it stores (its hash, its
parent's hash and its tokens) and every block it evicts. :class:`KvHoldings`
keeps those blocks as a tree, so it can follow any prompt's tokens block by block
without knowing vLLM's hash function: block ``j`` of a prompt is held when a block
with the same parent and the same tokens was stored and not evicted.

A router names prompt prefixes by its own keys (a hash of the first ``(i + 1) *
block_chars`` characters of its text of the prompt, see
:class:`llmesh.v1.inference_pb2.RoutePrefix`). When a request arrives, the replica
maps key ``i`` onto the engine's blocks covering the same share of the prompt's
tokens (rounded down to whole blocks) and reports the key *held* once every one of
those blocks is stored; it reports it *released* when any of them is evicted. The
prompt's blocks are usually stored a step after the request arrives, so a mapping
waits (bounded in count and time) until the events that complete it come in.

Changes collect until :meth:`KvHoldings.take_changes`; a lost event or a cleared
cache resets everything (``reset``), and the watchers start over from a snapshot.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

BlockHash = Hashable


@dataclass(frozen=True, slots=True)
class Stored:
    """Blocks stored as one chain: ``hashes[0]``'s parent is ``parent`` (None = the first block)."""

    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    """Every block is gone (the engine reset its prefix cache)."""


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the last :meth:`KvHoldings.take_changes` (``reset``: start over)."""

    reset: bool
    held: frozenset[int]
    released: frozenset[int]


def key_depths(
    keys: Sequence[int], block_chars: int, text_chars: int, tokens: int, block_size: int
) -> list[int]:
    """The number of whole engine blocks each key's share of the prompt covers (0 = none)."""
    if not keys or block_chars <= 0 or text_chars <= 0 or block_size <= 0:
        return [0] * len(keys)
    return [
        int(tokens * min(1.0, (i + 1) * block_chars / text_chars)) // block_size for i in range(len(keys))
    ]


@dataclass(slots=True)
class _Pending:
    """A prompt whose keys wait for the blocks that hold them."""

    tokens: tuple[int, ...]
    # (depth, key), deepest last; depth >= 1.
    targets: list[tuple[int, int]]
    deadline: float
    chain: list[BlockHash] = field(default_factory=list)


class KvHoldings:
    """The engine's stored blocks as a tree, and the routers' keys mapped onto them."""

    def __init__(
        self,
        block_size: int,
        *,
        max_keys: int = 100_000,
        max_pending: int = 1024,
        pending_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if block_size <= 0 or max_keys <= 0 or max_pending <= 0:
            raise ValueError("block_size, max_keys and max_pending must be > 0")
        self.block_size = block_size
        self._max_keys = max_keys
        self._max_pending = max_pending
        self._pending_s = pending_s
        self._clock = clock
        # Block tree: (parent, tokens) -> hash, hash -> (parent, tokens), parent -> children.
        self._by_content: dict[tuple[BlockHash | None, tuple[int, ...]], BlockHash] = {}
        self._blocks: dict[BlockHash, tuple[BlockHash | None, tuple[int, ...]]] = {}
        self._children: dict[BlockHash | None, set[BlockHash]] = {}
        # Held keys (LRU) -> the deepest block they need, and the reverse.
        self._keys: OrderedDict[int, BlockHash] = OrderedDict()
        self._block_keys: dict[BlockHash, set[int]] = {}
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self._serial = 0
        self._held: set[int] = set()
        self._released: set[int] = set()
        self._reset = False

    # -- what the watchers read ----------------------------------------------------------

    @property
    def blocks(self) -> int:
        """Blocks the engine holds (as far as the events said)."""
        return len(self._blocks)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def held_count(self) -> int:
        return len(self._keys)

    def held_keys(self) -> frozenset[int]:
        return frozenset(self._keys)

    def holds(self, key: int) -> bool:
        return key in self._keys

    def take_changes(self) -> Changes | None:
        """The changes since the last call, or None when nothing changed."""
        if not (self._reset or self._held or self._released):
            return None
        changes = Changes(self._reset, frozenset(self._held), frozenset(self._released))
        self._reset = False
        self._held.clear()
        self._released.clear()
        return changes

    # -- events --------------------------------------------------------------------------

    def apply(self, events: Iterable[Event]) -> None:
        """Applies one batch of the engine's events, then maps the keys it completes."""
        stored = False
        for event in events:
            if isinstance(event, Stored):
                self._store(event)
                stored = True
            elif isinstance(event, Removed):
                for block in event.hashes:
                    self._remove(block)
            else:
                self.clear()
        if stored:
            self._advance_all()
        self._expire()

    def clear(self) -> None:
        """Forgets everything (a cleared cache, or events lost): watchers start over."""
        self._by_content.clear()
        self._blocks.clear()
        self._children.clear()
        self._keys.clear()
        self._block_keys.clear()
        self._pending.clear()
        self._held.clear()
        self._released.clear()
        self._reset = True

    def _store(self, event: Stored) -> None:
        size = event.block_size or self.block_size
        parent = event.parent
        for i, block in enumerate(event.hashes):
            tokens = tuple(event.token_ids[i * size : (i + 1) * size])
            if len(tokens) != self.block_size:
                return  # a block size this map was not built for: ignore the rest of the chain
            old = self._blocks.get(block)
            if old is not None and old != (parent, tokens):
                self._remove(block)
            self._blocks[block] = (parent, tokens)
            self._by_content[(parent, tokens)] = block
            self._children.setdefault(parent, set()).add(block)
            parent = block

    def _remove(self, block: BlockHash) -> None:
        entry = self._blocks.pop(block, None)
        if entry is None:
            return
        parent, tokens = entry
        if self._by_content.get((parent, tokens)) == block:
            del self._by_content[(parent, tokens)]
        siblings = self._children.get(parent)
        if siblings is not None:
            siblings.discard(block)
            if not siblings:
                del self._children[parent]
        # Keys on this block, and on every block below it (unreachable now), are released.
        todo = [block]
        while todo:
            current = todo.pop()
            for key in self._block_keys.pop(current, ()):
                self._release(key)
            todo.extend(self._children.get(current, ()))

    # -- keys ----------------------------------------------------------------------------

    def expect(
        self, keys: Sequence[int], block_chars: int, text_chars: int, prompt_token_ids: Sequence[int]
    ) -> None:
        """A request with these router keys and these prompt tokens reached the engine."""
        depths = key_depths(keys, block_chars, text_chars, len(prompt_token_ids), self.block_size)
        targets = sorted((d, k) for d, k in zip(depths, keys, strict=True) if d > 0)
        if not targets:
            return
        deepest = targets[-1][0]
        pending = _Pending(
            tuple(prompt_token_ids[: deepest * self.block_size]),
            targets,
            self._clock() + self._pending_s,
        )
        if self._advance(pending):
            return
        self._serial += 1
        self._pending[self._serial] = pending
        while len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)

    def _advance(self, pending: _Pending) -> bool:
        """Follows the prompt's blocks as far as they are stored; maps (again) every key they
        cover, so a key released by an eviction meanwhile comes back with its blocks. True when
        every key is mapped."""
        chain = pending.chain
        # Blocks found earlier may have been evicted since: keep the part still stored.
        for i, block in enumerate(chain):
            if block not in self._blocks:
                del chain[i:]
                break
        size = self.block_size
        deepest = pending.targets[-1][0]
        parent = chain[-1] if chain else None
        while len(chain) < deepest:
            depth = len(chain)
            block = self._by_content.get((parent, pending.tokens[depth * size : (depth + 1) * size]))
            if block is None:
                break
            chain.append(block)
            parent = block
        for depth, key in pending.targets:
            if depth > len(chain):
                break
            self._hold(key, chain[depth - 1])
        return len(chain) >= deepest

    def _advance_all(self) -> None:
        finished = [serial for serial, pending in self._pending.items() if self._advance(pending)]
        for serial in finished:
            del self._pending[serial]

    def _expire(self) -> None:
        now = self._clock()
        while self._pending:
            serial, pending = next(iter(self._pending.items()))
            if pending.deadline > now:
                break
            del self._pending[serial]

    def _hold(self, key: int, block: BlockHash) -> None:
        old = self._keys.get(key)
        if old is not None and old != block:
            keys = self._block_keys.get(old)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._block_keys[old]
        self._keys[key] = block
        self._keys.move_to_end(key)
        self._block_keys.setdefault(block, set()).add(key)
        if old is None:
            self._released.discard(key)
            self._held.add(key)
        while len(self._keys) > self._max_keys:
            oldest, oldest_block = next(iter(self._keys.items()))
            keys = self._block_keys.get(oldest_block)
            if keys is not None:
                keys.discard(oldest)
                if not keys:
                    del self._block_keys[oldest_block]
            self._release(oldest)

    def _release(self, key: int) -> None:
        if self._keys.pop(key, None) is None:
            return
        self._held.discard(key)
        self._released.add(key)
