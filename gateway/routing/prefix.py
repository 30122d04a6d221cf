"""Prompt prefixes in blocks, and a bounded index of which replica served which prefix.

A prompt (the chat messages, or a raw prompt) is serialised and cut into blocks
of ``block_chars`` characters; block ``i``'s hash covers every character up to
the end of block ``i`` (a hash chain, like vLLM's KV-cache block hashes), so two
prompts share block hash ``i`` exactly when they share that whole prefix. The
index maps block hashes to the replica that last served them, in an LRU of
bounded size: an unbounded routing table is a known failure of peer routers.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence


def prefix_blocks(text: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained hashes of the first ``max_blocks`` whole blocks of ``text`` (at least one)."""
    if block_chars <= 0:
        raise ValueError("block_chars must be > 0")
    hashes: list[int] = []
    state = hashlib.blake2b(digest_size=8)
    full = min(len(text) // block_chars, max_blocks)
    for i in range(full):
        state.update(text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass"))
        hashes.append(int.from_bytes(state.copy().digest(), "big"))
    if not hashes:
        # A prompt shorter than one block still gets a key (the whole text).
        state.update(text.encode("utf-8", "surrogatepass"))
        hashes.append(int.from_bytes(state.digest(), "big"))
    return hashes


def conversation_text(parts: Iterable[tuple[str, str]]) -> str:
    """A stable serialisation of (role, content) pairs, in the order the engine sees them."""
    return "".join(f"<|{role}|>{content}\n" for role, content in parts)


class PrefixIndex:
    """Block hash -> replica id, least recently used entries evicted beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be > 0")
        self._capacity = capacity
        # block -> (replica, when recorded, monotonic seconds)
        self._entries: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def longest_match(
        self, blocks: Sequence[int], counts: Callable[[str, float], bool] | None = None
    ) -> list[tuple[int, str]]:
        """(matched block count, replica) candidates, longest prefix first, one per replica;
        with ``counts``, only entries for which ``counts(replica, when recorded)`` holds."""
        out: list[tuple[int, str]] = []
        seen: set[str] = set()
        for depth in range(len(blocks), 0, -1):
            entry = self._entries.get(blocks[depth - 1])
            if entry is None:
                continue
            replica, at = entry
            if counts is not None and not counts(replica, at):
                continue
            self._entries.move_to_end(blocks[depth - 1])
            if replica not in seen:
                seen.add(replica)
                out.append((depth, replica))
        return out

    def record(self, blocks: Sequence[int], replica: str) -> None:
        """Every block of the prompt now lives on ``replica``."""
        now = time.monotonic()
        for block in blocks:
            self._entries[block] = (replica, now)
            self._entries.move_to_end(block)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def forget_replica(self, replica: str) -> None:
        """Drops a removed replica's entries (its KV cache is gone with it)."""
        for block in [b for b, (r, _) in self._entries.items() if r == replica]:
            del self._entries[block]


class HeldIndex:
    """Block hash -> the replicas whose KV cache holds that prefix, as the replicas report it.

    Each replica's ``WatchPrefixes`` stream (a snapshot, then keys held and released) is
    applied here; every gateway keeps the same view, so all route alike without sharing
    state. A replica that leaves the ring, or whose stream breaks, is forgotten at once.
    """

    def __init__(self, released_memory: int = 65_536) -> None:
        self._holders: dict[int, set[str]] = {}
        self._by_replica: dict[str, set[int]] = {}
        # Per replica, the keys it released last (evicted) and when (monotonic seconds, as this
        # gateway heard it), most recent last, bounded.
        self._released: dict[str, OrderedDict[int, float]] = {}
        self._released_memory = released_memory

    def __len__(self) -> int:
        return len(self._holders)

    def held_by(self, replica: str) -> int:
        return len(self._by_replica.get(replica, ()))

    def update(self, replica: str, *, reset: bool, held: Iterable[int], released: Iterable[int]) -> None:
        if reset:
            self._drop_holdings(replica)
        keys = self._by_replica.setdefault(replica, set())
        gone = self._released.setdefault(replica, OrderedDict())
        now = time.monotonic()
        for key in held:
            keys.add(key)
            self._holders.setdefault(key, set()).add(replica)
            gone.pop(key, None)
        for key in released:
            keys.discard(key)
            holders = self._holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self._holders[key]
            gone[key] = now
            gone.move_to_end(key)
        while len(gone) > self._released_memory:
            gone.popitem(last=False)

    def evicted(self, replica: str, blocks: Sequence[int], since: float = float("-inf")) -> bool:
        """Whether ``replica`` released (evicted) any of these prefix keys, at ``since`` (monotonic
        seconds) or later, and holds it no more."""
        gone = self._released.get(replica)
        if not gone:
            return False
        for key in blocks:
            at = gone.get(key)
            if at is not None and at >= since:
                return True
        return False

    def longest_match(self, blocks: Sequence[int]) -> tuple[int, frozenset[str]]:
        """(matched block count, the replicas holding that prefix); (0, {}) when none holds any."""
        for depth in range(len(blocks), 0, -1):
            holders = self._holders.get(blocks[depth - 1])
            if holders:
                return depth, frozenset(holders)
        return 0, frozenset()

    def forget_replica(self, replica: str) -> None:
        self._drop_holdings(replica)
        self._released.pop(replica, None)

    def _drop_holdings(self, replica: str) -> None:
        for key in self._by_replica.pop(replica, ()):
            holders = self._holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self._holders[key]
