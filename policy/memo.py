"""A bounded memo of detector matches per checked text, so a text seen before is not scanned again.

A chat client re-sends the whole conversation every turn: the system prompt and all the earlier
turns come back with each new message, and without a memo the input check scans them all again,
so a conversation's policy CPU grows with the square of its length. Each segment's matches
depend only on the rules that apply to it, its text, and whether it is a document; so they are
kept, per tenant, under the digest of those, and found again when the same text comes back.

Exactness: an entry holds a weak reference to the :class:`~policy.rules.Ruleset` object it was
scanned with and is used only with that same object (identity), so a reload, a tenant override or
any other ruleset never sees another's matches, and entries do not keep a replaced ruleset (its
detectors, its classifier) in memory. Findings and redactions are rebuilt from the matches for
each request (message indexes and placeholders are per request), so a memo hit gives the very
decision a fresh scan would.

Tenancy: the key holds the tenant, so a tenant never gets another tenant's entry, nor learns from
a check's speed that another tenant sent the same text. What an entry keeps in memory is the
matched values (what redaction replaces), never the text itself; the bound is in bytes, least
recently used entries go first.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from policy.detectors import Match
from policy.metrics import SCAN_MEMO
from policy.rules import Ruleset

# What one entry costs besides its matches (key, ruleset reference, dict and tuple overhead).
ENTRY_OVERHEAD_BYTES = 240
MATCH_BYTES = 120

Matches = tuple[tuple[Match, ...], ...]


@dataclass(frozen=True, slots=True)
class _Entry:
    ruleset: weakref.ref[Ruleset]
    matches: Matches
    size: int


class ScanMemo:
    """Matches per (tenant, scope, role, document flag, text), least recently used out beyond
    ``max_bytes`` (0 = off: every lookup misses, nothing is kept)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # Used from the event loop's thread only (the checks run there): no lock.
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(tenant: str, scope: str, role: str, document: bool, text: str) -> bytes:
        h = hashlib.blake2b(digest_size=20)
        for part in (tenant, scope, role, "d" if document else "m"):
            encoded = part.encode("utf-8", "surrogatepass")
            h.update(len(encoded).to_bytes(4, "big"))
            h.update(encoded)
        h.update(text.encode("utf-8", "surrogatepass"))
        return h.digest()

    def get(self, key: bytes, ruleset: Ruleset) -> Matches | None:
        if not self.max_bytes:
            return None
        entry = self._entries.get(key)
        if entry is None or entry.ruleset() is not ruleset:
            self.misses += 1
            SCAN_MEMO.labels("miss").inc()
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        SCAN_MEMO.labels("hit").inc()
        return entry.matches

    def put(self, key: bytes, ruleset: Ruleset, matches: Matches) -> None:
        size = ENTRY_OVERHEAD_BYTES + sum(
            MATCH_BYTES + len(m.value) + len(m.entity_type) for found in matches for m in found
        )
        if not self.max_bytes or size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        self._entries[key] = _Entry(weakref.ref(ruleset), matches, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.size

    def lookup_or_scan(self, key: bytes, ruleset: Ruleset, scan: Callable[[], Matches]) -> Matches:
        found = self.get(key, ruleset)
        if found is None:
            found = scan()
            self.put(key, ruleset, found)
        return found
