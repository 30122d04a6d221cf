"""KvHoldings: routers' keys mapped onto the engine's stored blocks, from KV events alone."""

from __future__ import annotations

import pytest

from services.inference.kv_holdings import Cleared, KvHoldings, Removed, Stored, key_depths

BS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chain(tokens: list[int], names: str, parent: str | None = None) -> Stored:
    """Blocks named by the letters of ``names`` holding ``tokens`` (BS each)."""
    return Stored(tuple(names), parent, tuple(tokens), BS)


PROMPT = list(range(100, 116))  # 4 blocks: a b c d
KEYS = [11, 12, 13, 14]  # each key covers a quarter of the text -> depths 1..4


def expect(h: KvHoldings, keys: list[int] = KEYS, prompt: list[int] = PROMPT) -> None:
    h.expect(keys, block_chars=10, text_chars=10 * len(keys), prompt_token_ids=prompt)


def test_key_depths_cover_the_same_share_of_tokens_rounded_down_to_whole_blocks() -> None:
    assert key_depths([1, 2, 3, 4], 10, 40, 16, 4) == [1, 2, 3, 4]
    assert key_depths([1, 2, 3], 10, 40, 16, 4) == [1, 2, 3]  # the text goes on past the keys
    assert key_depths([1, 2], 10, 15, 7, 4) == [1, 1]  # 4.7 and 7 tokens: one whole block each
    assert key_depths([1, 2, 3, 4], 10, 40, 8, 4) == [0, 1, 1, 2]
    assert key_depths([1], 0, 15, 7, 4) == [0]


def test_keys_are_held_once_their_blocks_are_stored() -> None:
    h = KvHoldings(BS)
    expect(h)
    assert h.take_changes() is None and h.pending == 1
    h.apply([chain(PROMPT[:8], "ab")])
    changes = h.take_changes()
    assert changes is not None and changes.held == {11, 12} and not changes.reset
    h.apply([chain(PROMPT[8:], "cd", parent="b")])
    changes = h.take_changes()
    assert changes is not None and changes.held == {13, 14}
    assert h.pending == 0 and h.held_keys() == set(KEYS)


def test_a_prompt_whose_blocks_are_stored_already_is_held_at_once() -> None:
    h = KvHoldings(BS)
    h.apply([chain(PROMPT, "abcd")])
    expect(h)
    assert h.pending == 0 and h.held_keys() == set(KEYS)


def test_an_evicted_block_releases_its_keys_and_every_key_below_it() -> None:
    h = KvHoldings(BS)
    h.apply([chain(PROMPT, "abcd")])
    expect(h)
    h.take_changes()
    h.apply([Removed(("b",))])
    changes = h.take_changes()
    assert changes is not None and changes.released == {12, 13, 14} and not changes.held
    assert h.held_keys() == {11}
    # Stored again (same parent, same tokens): a new request maps the keys again.
    h.apply([chain(PROMPT[4:8], "b", parent="a")])
    expect(h)
    assert h.held_keys() == set(KEYS)


def test_other_tokens_under_the_same_parent_do_not_count() -> None:
    h = KvHoldings(BS)
    other = [*PROMPT[:4], 9, 9, 9, 9, *PROMPT[8:]]
    h.apply([chain(other, "axyz")])
    expect(h)
    assert h.held_keys() == {11}


def test_a_block_evicted_while_its_prompt_waits_is_followed_again() -> None:
    h = KvHoldings(BS)
    h.apply([chain(PROMPT[:8], "ab")])
    expect(h)
    assert h.held_keys() == {11, 12}
    h.apply([Removed(("a",))])
    assert h.held_keys() == set()
    h.apply([chain(PROMPT[8:], "cd", parent="b")])
    assert h.held_keys() == set(), "c and d hang below an evicted block"
    h.apply([chain(PROMPT[:4], "a")])
    assert h.held_keys() == set(KEYS)


def test_cleared_resets_and_forgets_everything() -> None:
    h = KvHoldings(BS)
    h.apply([chain(PROMPT, "abcd")])
    expect(h)
    h.take_changes()
    h.apply([Cleared()])
    changes = h.take_changes()
    assert changes is not None and changes.reset and not changes.held
    assert h.held_keys() == set() and h.blocks == 0


def test_waiting_prompts_are_bounded_in_count_and_time() -> None:
    clock = Clock()
    h = KvHoldings(BS, max_pending=2, pending_s=10.0, clock=clock)
    for i in range(3):
        expect(h, keys=[i * 10 + k for k in range(4)], prompt=[i] * 16)
    assert h.pending == 2
    clock.now = 11.0
    h.apply([])
    assert h.pending == 0
    h.apply([chain([1] * 16, "abcd")])
    assert h.held_keys() == set(), "an expired prompt is not mapped"


def test_held_keys_are_bounded_oldest_released_first() -> None:
    h = KvHoldings(BS, max_keys=3)
    h.apply([chain(PROMPT, "abcd")])
    expect(h)
    assert h.held_keys() == {12, 13, 14}
    changes = h.take_changes()
    assert changes is not None and changes.held == {12, 13, 14}


def test_a_change_and_its_undo_in_one_window_cancel_out() -> None:
    h = KvHoldings(BS)
    h.apply([chain(PROMPT, "abcd")])
    h.take_changes()
    expect(h)
    h.apply([Removed(("a",))])
    changes = h.take_changes()
    assert changes is not None and not changes.held and changes.released == set(KEYS)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        KvHoldings(0)
