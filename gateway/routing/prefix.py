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
from collections import OrderedDict
from collections.abc import Iterable, Sequence


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
        self._entries: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def longest_match(self, blocks: Sequence[int]) -> list[tuple[int, str]]:
        """(matched block count, replica) candidates, longest prefix first, one per replica."""
        out: list[tuple[int, str]] = []
        seen: set[str] = set()
        for depth in range(len(blocks), 0, -1):
            replica = self._entries.get(blocks[depth - 1])
            if replica is None:
                continue
            self._entries.move_to_end(blocks[depth - 1])
            if replica not in seen:
                seen.add(replica)
                out.append((depth, replica))
        return out

    def record(self, blocks: Sequence[int], replica: str) -> None:
        """Every block of the prompt now lives on ``replica``."""
        for block in blocks:
            self._entries[block] = replica
            self._entries.move_to_end(block)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def forget_replica(self, replica: str) -> None:
        """Drops a removed replica's entries (its KV cache is gone with it)."""
        for block in [b for b, r in self._entries.items() if r == replica]:
            del self._entries[block]
