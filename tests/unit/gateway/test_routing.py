"""Prefix affinity, bounded-load consistent hashing, the LRU index and the circuit breaker."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.routing.balancer import Balancer, Choice, make_replicas
from gateway.routing.breaker import BreakerState, CircuitBreaker
from gateway.routing.prefix import HeldIndex, PrefixIndex, prefix_blocks
from gateway.routing.ring import HashRing

SYSTEM = "You are a helpful assistant for ACME. " * 20


def test_blocks_share_exactly_the_common_prefix() -> None:
    a = prefix_blocks(SYSTEM + "question one", 64, 32)
    b = prefix_blocks(SYSTEM + "another question entirely", 64, 32)
    shared = len(SYSTEM) // 64
    assert a[:shared] == b[:shared]
    assert prefix_blocks("x" * 10, 64, 4) != prefix_blocks("y" * 10, 64, 4)
    assert len(prefix_blocks("z" * 1000, 64, 4)) == 4


def test_index_is_bounded_lru() -> None:
    index = PrefixIndex(capacity=3)
    index.record([1, 2], "a")
    index.record([3], "b")
    assert index.longest_match([1, 2]) == [(2, "a")]  # touches 1 and 2
    index.record([4], "c")  # evicts 3, the least recently used
    assert len(index) == 3
    assert index.longest_match([3]) == []
    index.forget_replica("a")
    assert index.longest_match([1, 2]) == []


def test_ring_respects_the_load_bound() -> None:
    ring = HashRing(virtual_nodes=32, load_factor=1.25)
    for name in ("a", "b", "c"):
        ring.add(name)
    loads = {"a": 0, "b": 0, "c": 0}
    # One hot key: without the bound every request would land on one replica.
    for _ in range(30):
        owner = ring.lookup(12345, loads.__getitem__, loads)
        assert owner is not None
        loads[owner] += 1
    assert max(loads.values()) <= ring.bound(29, 3)
    assert min(loads.values()) > 0


def test_ring_moves_only_the_removed_replicas_keys() -> None:
    ring = HashRing(virtual_nodes=64)
    for name in ("a", "b", "c"):
        ring.add(name)
    zero = {"a": 0, "b": 0, "c": 0}.__getitem__
    keys = [prefix_blocks(f"prompt {k}", 64, 1)[0] for k in range(300)]
    before = {k: ring.lookup(k, zero, ["a", "b", "c"]) for k in keys}
    ring.remove("b")
    after = {k: ring.lookup(k, zero, ["a", "c"]) for k in keys}
    moved = [k for k in before if before[k] != after[k]]
    assert moved and all(before[k] == "b" for k in moved)


def _balancer(policy: str = "affinity") -> Balancer:
    return Balancer(make_replicas(["r1", "r2", "r3"]), policy=policy, virtual_nodes=32)  # type: ignore[arg-type]


def test_same_prefix_goes_to_the_same_replica() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM + "first", 64, 16)
    first = balancer.choose(blocks)
    assert first is not None
    balancer.started(first.replica)
    balancer.first_token(first.replica, blocks, 0.1)
    balancer.finished(first.replica, ok=True)
    for question in ("second", "third", "fourth"):
        again = balancer.choose(prefix_blocks(SYSTEM + question, 64, 16))
        assert again is not None and again.replica is first.replica
        assert again.reason == "prefix" and again.matched_blocks >= len(SYSTEM) // 64


def test_affinity_spills_when_the_preferred_replica_is_loaded() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM, 64, 16)
    home = balancer.choose(blocks)
    assert home is not None
    balancer.first_token(home.replica, blocks, 0.1)
    home.replica.inflight = 10  # far above ceil(1.25 * 11 / 3)
    other = balancer.choose(blocks)
    assert other is not None and other.replica is not home.replica


def test_unhealthy_replica_leaves_at_once_and_returns() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM, 64, 16)
    home = balancer.choose(blocks)
    assert home is not None
    balancer.first_token(home.replica, blocks, 0.1)
    balancer.set_healthy(home.replica.id, False)
    for _ in range(10):
        pick = balancer.choose(blocks)
        assert pick is not None and pick.replica is not home.replica
    balancer.set_healthy(home.replica.id, True)
    assert home.replica.id in balancer.eligible()


def _not_the_ring_owner(balancer: Balancer, blocks: list[int]) -> str:
    owner = balancer.ring.lookup(blocks[0], lambda _: 0, balancer.eligible())
    return next(r for r in ("r1", "r2", "r3") if r != owner)


def test_the_replica_reported_holding_the_longest_prefix_wins() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM + "question", 64, 16)
    holder = _not_the_ring_owner(balancer, blocks)
    other = next(r for r in ("r1", "r2", "r3") if r != holder)
    balancer.held.update(other, reset=True, held=blocks[:3], released=[])
    balancer.held.update(holder, reset=True, held=blocks[:8], released=[])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason, pick.matched_blocks) == (holder, "kv", 8)
    # Its blocks evicted: the next deepest holder.
    balancer.held.update(holder, reset=False, held=[], released=blocks[1:8])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.matched_blocks) == (other, 3)


def test_a_holder_over_the_load_bound_is_passed_over_for_the_ring() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM, 64, 16)
    holder = _not_the_ring_owner(balancer, blocks)
    balancer.held.update(holder, reset=True, held=blocks, released=[])
    balancer.replicas[holder].inflight = 10
    pick = balancer.choose(blocks)
    assert pick is not None and pick.replica.id != holder and pick.reason == "ring"


def test_a_longer_prefix_just_sent_elsewhere_beats_an_older_report_until_it_is_stale() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM + "question", 64, 16)
    holder = _not_the_ring_owner(balancer, blocks)
    sent = next(r for r in ("r1", "r2", "r3") if r != holder)
    balancer.held.update(holder, reset=True, held=blocks[:4], released=[])
    balancer.watched.update({holder, sent})
    balancer.first_token(balancer.replicas[sent], blocks, 0.1)  # its events are not in yet
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (sent, "prefix")
    # The replica's events would have reported it by now: the memory no longer counts.
    balancer.recent_s = 0.0
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (holder, "kv")


def test_what_was_just_sent_to_a_replica_stops_counting_once_it_reports_evicting_it() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM + "question", 64, 16)
    sent = _not_the_ring_owner(balancer, blocks)
    balancer.watched.update(("r1", "r2", "r3"))
    # Evicted there once before: an old release does not cancel what was sent since.
    balancer.held.update(sent, reset=True, held=blocks, released=[])
    balancer.held.update(sent, reset=False, held=[], released=blocks)
    balancer.first_token(balancer.replicas[sent], blocks, 0.1)  # sent again; no report yet
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (sent, "prefix")
    # Its reports show it evicting the prompt after it was sent: the ring decides again.
    balancer.held.update(sent, reset=False, held=blocks, released=[])
    balancer.held.update(sent, reset=False, held=[], released=blocks[2:])
    pick = balancer.choose(blocks)
    assert pick is not None and pick.replica.id != sent and pick.reason in ("ring", "evicted")


def _new_prompt(balancer: Balancer, text: str) -> tuple[list[int], Choice, list[str]]:
    """A prompt nobody holds yet: its blocks, its ring owner's choice and the other replicas,
    every replica's reports live (watched)."""
    blocks = prefix_blocks(text, 64, 16)
    owner = balancer.choose(blocks)
    assert owner is not None and owner.reason == "ring"
    balancer.watched.update(("r1", "r2", "r3"))
    return blocks, owner, [r for r in ("r1", "r2", "r3") if r != owner.replica.id]


def test_a_prompt_nobody_holds_goes_where_the_reports_show_room() -> None:
    balancer = _balancer()
    blocks, owner, others = _new_prompt(balancer, "A system prompt nobody has sent yet. " * 20)
    # The owner holds 40 keys of other prompts, one replica 30, the other 10.
    balancer.held.update(owner.replica.id, reset=True, held=range(1000, 1040), released=[])
    balancer.held.update(others[0], reset=True, held=range(2000, 2030), released=[])
    balancer.held.update(others[1], reset=True, held=range(3000, 3010), released=[])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (others[1], "room")
    # Within one prompt's worth of keys (16) of the owner: the ring owner, for stability.
    balancer.held.update(others[1], reset=True, held=range(3000, 3025), released=[])
    balancer.held.update(others[0], reset=True, held=range(2000, 2035), released=[])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (owner.replica.id, "ring")
    # The roomier replica over the load bound, or not watched (its reports unknown): the owner.
    balancer.held.update(others[1], reset=True, held=[], released=[])
    balancer.replicas[others[1]].inflight = 10
    pick = balancer.choose(blocks)
    assert pick is not None and pick.replica.id == owner.replica.id
    balancer.replicas[others[1]].inflight = 0
    balancer.watched.discard(others[1])
    pick = balancer.choose(blocks)
    assert pick is not None and pick.replica.id == owner.replica.id
    # A prompt somebody holds still goes to its holder, however full.
    balancer.watched.add(others[1])
    balancer.held.update(owner.replica.id, reset=False, held=blocks, released=[])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (owner.replica.id, "kv")


def test_a_prompt_its_ring_owner_evicted_goes_to_a_replica_that_did_not() -> None:
    balancer = _balancer()
    blocks, owner, others = _new_prompt(balancer, "A system prompt that keeps being evicted. " * 20)
    for replica in ("r1", "r2", "r3"):
        balancer.held.update(replica, reset=True, held=range(1000, 1030), released=[])
    # The owner held the prompt and evicted it (tail first, then the rest).
    balancer.held.update(owner.replica.id, reset=False, held=blocks, released=[])
    balancer.held.update(owner.replica.id, reset=False, held=[], released=blocks[8:])
    balancer.held.update(owner.replica.id, reset=False, held=[], released=blocks[:8])
    assert balancer.held.evicted(owner.replica.id, blocks)
    # One other replica evicted it too: the third, although all hold as many keys.
    balancer.held.update(others[0], reset=False, held=[], released=blocks[-1:])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (others[1], "evicted")
    # Every replica evicted it: the ring owner again.
    balancer.held.update(others[1], reset=False, held=[], released=blocks[-1:])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (owner.replica.id, "ring")
    # Held again somewhere: a holder wins, and its eviction record is gone.
    balancer.held.update(others[1], reset=False, held=blocks, released=[])
    assert not balancer.held.evicted(others[1], blocks)
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (others[1], "kv")
    # A replica that leaves the ring is forgotten, evictions included.
    balancer.set_healthy(owner.replica.id, False)
    assert not balancer.held.evicted(owner.replica.id, blocks)


def test_a_prompt_its_holder_evicted_most_of_moves_to_a_replica_that_did_not() -> None:
    balancer = _balancer()
    blocks, owner, others = _new_prompt(balancer, "A system prompt squeezed out of a full cache. " * 30)
    assert len(blocks) == 16
    # The owner held it and evicted its tail (a cache too full for it): half is still a hit.
    balancer.held.update(owner.replica.id, reset=True, held=blocks, released=[])
    balancer.held.update(owner.replica.id, reset=False, held=[], released=blocks[8:])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason, pick.matched_blocks) == (
        owner.replica.id,
        "kv",
        8,
    )
    # Less than half left: a replica that did not evict it, holding fewest keys.
    balancer.held.update(owner.replica.id, reset=False, held=[], released=blocks[7:8])
    balancer.held.update(others[0], reset=True, held=range(1000, 1020), released=[])
    balancer.held.update(others[1], reset=True, held=range(2000, 2010), released=[])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason) == (others[1], "evicted")
    # A holder of less than half that never evicted any of it (another prompt's shared start)
    # still holds what it holds.
    balancer.held.update(others[0], reset=False, held=blocks[:7], released=[])
    pick = balancer.choose(blocks)
    assert pick is not None and (pick.replica.id, pick.reason, pick.matched_blocks) == (others[0], "kv", 7)


def test_the_eviction_memory_is_bounded() -> None:
    held = HeldIndex(released_memory=4)
    held.update("a", reset=True, held=range(10), released=[])
    held.update("a", reset=False, held=[], released=range(10))
    assert not held.evicted("a", [0, 5]) and held.evicted("a", [6]) and held.evicted("a", [9])
    # A snapshot keeps what was evicted before it.
    held.update("a", reset=True, held=[1], released=[])
    assert held.evicted("a", [9]) and held.held_by("a") == 1


def test_a_replica_leaving_the_ring_is_forgotten_as_a_holder() -> None:
    balancer = _balancer()
    blocks = prefix_blocks(SYSTEM, 64, 16)
    holder = _not_the_ring_owner(balancer, blocks)
    balancer.held.update(holder, reset=True, held=blocks, released=[])
    balancer.set_healthy(holder, False)
    assert balancer.held.held_by(holder) == 0 and len(balancer.held) == 0
    balancer.set_healthy(holder, True)
    pick = balancer.choose(blocks)
    assert pick is not None and pick.reason == "ring"


def test_ring_and_round_robin_ignore_reported_holders() -> None:
    for policy in ("ring", "round_robin"):
        balancer = _balancer(policy)
        blocks = prefix_blocks(SYSTEM, 64, 16)
        holder = _not_the_ring_owner(balancer, blocks)
        balancer.held.update(holder, reset=True, held=blocks, released=[])
        reasons = {pick.reason for pick in (balancer.choose(blocks) for _ in range(6)) if pick is not None}
        assert reasons == {policy}


def test_held_index_applies_snapshots_and_changes() -> None:
    held = HeldIndex()
    held.update("a", reset=True, held=[1, 2, 3], released=[])
    held.update("b", reset=True, held=[1], released=[])
    assert held.longest_match([1, 2, 3, 4]) == (3, frozenset({"a"}))
    assert held.longest_match([1, 9]) == (1, frozenset({"a", "b"}))
    held.update("a", reset=False, held=[], released=[3])
    assert held.longest_match([1, 2, 3]) == (2, frozenset({"a"}))
    held.update("a", reset=True, held=[7], released=[])
    assert held.longest_match([1, 2]) == (1, frozenset({"b"})) and held.held_by("a") == 1
    held.forget_replica("b")
    assert held.longest_match([1]) == (0, frozenset()) and len(held) == 1


def test_exclude_and_none_left() -> None:
    balancer = _balancer()
    assert balancer.choose([1], exclude={"r1", "r2", "r3"}) is None


def test_round_robin_spreads_evenly() -> None:
    balancer = _balancer("round_robin")
    picks: Counter[str] = Counter()
    for _ in range(30):
        choice = balancer.choose([1])
        assert choice is not None
        picks[choice.replica.id] += 1
    assert set(picks.values()) == {10}


def state(breaker: CircuitBreaker) -> BreakerState:
    """The breaker's state, read through a call (mypy would narrow the attribute)."""
    return breaker.state


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_on_consecutive_failures_and_half_opens() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, open_s=10, clock=clock)
    breaker.failure()
    breaker.failure()
    assert breaker.allows()
    breaker.failure()
    assert state(breaker) is BreakerState.OPEN and not breaker.allows()
    clock.now = 10.5
    assert breaker.allows()  # the half-open trial
    assert not breaker.allows()  # only one at a time
    breaker.failure()
    assert state(breaker) is BreakerState.OPEN
    clock.now = 21
    assert breaker.allows()
    breaker.success(0.1)
    assert state(breaker) is BreakerState.CLOSED


def test_breaker_opens_on_ttft_far_above_norm() -> None:
    breaker = CircuitBreaker(failures=2, ttft_factor=10, clock=Clock())
    for _ in range(CircuitBreaker.MIN_SAMPLES):
        breaker.success(0.1)
    breaker.success(5.0)
    assert state(breaker) is BreakerState.CLOSED
    breaker.success(5.0)
    assert state(breaker) is BreakerState.OPEN


def test_ttft_bound_scales_with_the_load_the_request_met() -> None:
    # A burst queues every first token behind the others: slow, not faulty.
    breaker = CircuitBreaker(failures=2, ttft_factor=10, clock=Clock(), ttft_floor_s=0.5)
    for _ in range(CircuitBreaker.MIN_SAMPLES):
        breaker.success(0.1)
    assert breaker.first_token_bound() == pytest.approx(1.0)
    assert breaker.first_token_bound(load=15) == pytest.approx(16.0)
    for _ in range(5):
        breaker.success(8.0, load=15)  # 0.5 s per unit of load: within the norm's bound
    assert state(breaker) is BreakerState.CLOSED
    breaker.success(5.0, load=0)
    breaker.success(5.0, load=0)  # the same 5 s with nothing else in flight is a fault
    assert state(breaker) is BreakerState.OPEN


def test_slow_first_tokens_never_open_the_last_eligible_replica() -> None:
    balancer = _balancer()
    for replica in list(balancer.replicas.values())[1:]:
        balancer.set_healthy(replica.id, False)
    last = next(iter(balancer.replicas.values()))
    for _ in range(CircuitBreaker.MIN_SAMPLES):
        balancer.first_token(last, [1], 0.01)
    for _ in range(10):
        balancer.first_token(last, [1], 100.0)  # slow beats none
    assert state(last.breaker) is BreakerState.CLOSED
    assert balancer.choose([1]) is not None


def test_open_breaker_takes_replica_out_of_routing() -> None:
    balancer = _balancer()
    replica = balancer.replicas["r1"]
    for _ in range(3):
        replica.breaker.failure()
    for _ in range(20):
        choice = balancer.choose([7, 8, 9])
        assert choice is not None and choice.replica is not replica


@pytest.mark.parametrize("capacity", [0, -1])
def test_index_needs_capacity(capacity: int) -> None:
    with pytest.raises(ValueError):
        PrefixIndex(capacity)
