"""Which inference replica serves a request.

``affinity`` (the default): the replica whose KV cache holds the longest prefix of
the prompt, as the replicas themselves report it (``WatchPrefixes``, from vLLM's
KV-cache events), or the one this gateway sent a longer prefix to moments ago
(its events may not be in yet), if it is eligible and within the bounded-load
limit; otherwise (nobody holds it, or its holders evicted more than half of it)
the consistent-hash owner of the prompt's first block (so a new system prompt lands
on a stable replica), spilling clockwise under the load bound; when the replicas'
reports show the owner evicted that prompt, or another replica holding clearly fewer
prefixes than the owner (more than one prompt's worth of keys), the prompt goes to
that other replica instead, so the working set settles where it fits. ``ring`` is the
hash ring alone; ``round_robin`` and ``least_loaded`` exist for comparison. Eligible =
healthy, circuit breaker not open, and not already tried by this request. Every choice
is counted by its reason (``llmesh_gateway_route_choices_total``) and logged at debug level.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.routing.breaker import CircuitBreaker
from gateway.routing.prefix import HeldIndex, PrefixIndex
from gateway.routing.ring import HashRing

Policy = Literal["affinity", "ring", "round_robin", "least_loaded"]


@dataclass(eq=False)
class Replica:
    """One inference replica: its address, client, load and health."""

    address: str
    breaker: CircuitBreaker
    client: Any = None
    healthy: bool = True
    inflight: int = 0
    served: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.address


@dataclass(frozen=True)
class Choice:
    replica: Replica
    # How many prefix blocks matched the replica's index entries (0 = none).
    matched_blocks: int
    reason: str


class Balancer:
    """Chooses replicas and learns from the outcome (pure: no I/O)."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        policy: Policy = "affinity",
        index_size: int = 100_000,
        virtual_nodes: int = 64,
        load_factor: float = 1.25,
        recent_s: float = 5.0,
        room_margin: int = 16,
    ) -> None:
        if not replicas:
            raise ValueError("at least one inference replica is needed")
        self.replicas = {r.id: r for r in replicas}
        self.policy: Policy = policy
        self.index = PrefixIndex(index_size)
        self.held = HeldIndex()
        # Replicas whose WatchPrefixes stream is live: what this gateway sent there counts only
        # for `recent_s` (until the replica's own events report it), not until it is evicted.
        self.watched: set[str] = set()
        self.recent_s = recent_s
        # Prefix keys: a replica counts as roomier than the ring owner of a prompt nobody holds
        # when it holds more than this many fewer (the gateway's keys per prompt, route_max_blocks).
        self.room_margin = room_margin
        self.ring = HashRing(virtual_nodes, load_factor)
        for replica in replicas:
            self.ring.add(replica.id)
        self._rr = itertools.count()

    def _load(self, replica_id: str) -> int:
        return self.replicas[replica_id].inflight

    def eligible(self, exclude: Collection[str] = ()) -> list[str]:
        return [
            r.id
            for r in self.replicas.values()
            if r.healthy and r.id not in exclude and r.breaker.available()
        ]

    def set_healthy(self, replica_id: str, healthy: bool) -> None:
        """Health-driven ring membership: unhealthy replicas leave the ring (and the index) at once."""
        replica = self.replicas[replica_id]
        if replica.healthy == healthy:
            return
        replica.healthy = healthy
        if healthy:
            self.ring.add(replica_id)
        else:
            self.ring.remove(replica_id)
            self.index.forget_replica(replica_id)
            self.held.forget_replica(replica_id)
            self.watched.discard(replica_id)

    def choose(self, blocks: Sequence[int], exclude: Collection[str] = ()) -> Choice | None:
        """The replica for a prompt with these prefix blocks, or None when none is eligible."""
        eligible = self.eligible(exclude)
        if not eligible:
            return None
        choice = self._pick(blocks, eligible)
        if not choice.replica.breaker.allows():
            # Lost the half-open trial slot to a concurrent request: try the others.
            rest = [r for r in eligible if r != choice.replica.id]
            return self.choose(blocks, {*exclude, choice.replica.id}) if rest else None
        return choice

    def _pick(self, blocks: Sequence[int], eligible: list[str]) -> Choice:
        if self.policy == "round_robin":
            return Choice(self.replicas[eligible[next(self._rr) % len(eligible)]], 0, "round_robin")
        if self.policy == "least_loaded":
            return Choice(self.replicas[min(eligible, key=self._load)], 0, "least_loaded")
        if self.policy == "affinity":
            choice = self._by_prefix(blocks, eligible)
            if choice is not None:
                return choice
        owner = self.ring.lookup(blocks[0] if blocks else 0, self._load, eligible)
        if owner is None:  # eligible replicas not on the ring (cannot happen once health syncs)
            owner = min(eligible, key=self._load)
        if self.policy == "affinity":
            return self._unheld(owner, blocks, eligible)
        return Choice(self.replicas[owner], 0, "ring")

    def _unheld(self, owner: str, blocks: Sequence[int], eligible: list[str]) -> Choice:
        """A prompt no replica holds: the ring owner, unless the replicas' reports show it has no
        room there. The ring alone splits prompts unevenly (8 of 12 on one of two replicas 39 % of
        the time), and the owner of too many then evicts its own prompts on every visit while the
        other replica has room. So, among watched replicas under the load bound:

        * ``evicted``: the owner evicted this prompt (released one of its keys; it holds none of
          them now): the replica that did not, holding fewest keys;
        * ``room``: another replica holds more than ``room_margin`` keys (about one prompt's
          worth) fewer than the owner and did not evict it: the one holding fewest.

        Every gateway sees the same reports, so all choose alike; the prompt is found where it
        went by its next visit."""
        if owner not in self.watched:
            return Choice(self.replicas[owner], 0, "ring")
        held_by = self.held.held_by
        others = [
            r
            for r in eligible
            if r != owner
            and r in self.watched
            and not self.held.evicted(r, blocks)
            and self.ring.within_bound(r, self._load, eligible)
        ]
        if others and self.held.evicted(owner, blocks):
            return Choice(self.replicas[min(others, key=held_by)], 0, "evicted")
        roomy = [r for r in others if held_by(owner) - held_by(r) > self.room_margin]
        if roomy:
            return Choice(self.replicas[min(roomy, key=held_by)], 0, "room")
        return Choice(self.replicas[owner], 0, "ring")

    def _by_prefix(self, blocks: Sequence[int], eligible: list[str]) -> Choice | None:
        """The replica holding the longest prefix (reported, else recently sent) under the bound."""

        def fits(replica_id: str) -> bool:
            return replica_id in eligible and self.ring.within_bound(replica_id, self._load, eligible)

        depth, holders = self.held.longest_match(blocks)
        held = sorted((r for r in holders if fits(r)), key=self._load)
        if depth * 2 < len(blocks):
            # What is left of a prompt a holder evicted most of (its cache is too full to keep it)
            # does not hold it there: without another holder it is routed as a prompt nobody
            # holds (_unheld), to a replica that did not evict it, instead of missing on every visit.
            held = [r for r in held if not self.held.evicted(r, blocks)]
        recent = time.monotonic() - self.recent_s

        def counts(replica_id: str, sent_at: float) -> bool:
            # What this gateway sent to a replica whose reports are live counts until they have
            # had time to report it, and not once they report evicting it since.
            if replica_id not in self.watched:
                return True
            return sent_at >= recent and not self.held.evicted(replica_id, blocks, sent_at)

        for sent_depth, replica_id in self.index.longest_match(blocks, counts):
            if sent_depth <= depth and held:
                break
            if fits(replica_id):
                return Choice(self.replicas[replica_id], sent_depth, "prefix")
        if held:
            return Choice(self.replicas[held[0]], depth, "kv")
        return None

    def started(self, replica: Replica) -> None:
        replica.inflight += 1

    def first_token(
        self, replica: Replica, blocks: Sequence[int], ttft_s: float | None, load: int = 0
    ) -> None:
        """The prompt is prefilled on ``replica`` (``load`` = other requests in flight there
        when it was sent): its prefix now lives there."""
        alone = not self.eligible({replica.id})
        replica.breaker.success(ttft_s, load=load, count_slow=not alone)
        if self.policy == "affinity":
            self.index.record(blocks, replica.id)

    def finished(self, replica: Replica, *, ok: bool) -> None:
        """The request left the replica; a failure feeds its breaker."""
        replica.inflight = max(0, replica.inflight - 1)
        if ok:
            replica.served += 1
        else:
            replica.breaker.failure()


def make_replicas(
    addresses: Sequence[str], breaker: Callable[[], CircuitBreaker] = CircuitBreaker
) -> list[Replica]:
    return [Replica(address=a, breaker=breaker()) for a in dict.fromkeys(addresses)]
