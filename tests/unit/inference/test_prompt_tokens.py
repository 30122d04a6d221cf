"""Prompt tokens remembered between special tokens: the same ids as the tokenizer, or not used."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.inference.model import default_model_dir, is_prepared, prepare
from services.inference.prompt_tokens import SegmentMemo, handles, remember_segments, truncated


def _load() -> Any:
    from transformers import AutoTokenizer

    if not is_prepared(default_model_dir()):
        prepare()
    return AutoTokenizer.from_pretrained(str(default_model_dir()))


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Any, Any]]:
    """The model's tokenizer remembering stretches, and one as loaded (the reference)."""
    remembering, plain = _load(), _load()
    assert remember_segments(remembering) is not None
    yield remembering, plain


# -- the memo on its own ------------------------------------------------------------------------


def _letters(text: str) -> list[int]:
    return [ord(ch) for ch in text]


def test_text_splits_on_the_longest_special_token_and_stretches_are_remembered() -> None:
    calls: list[str] = []

    def encode(text: str) -> list[int]:
        calls.append(text)
        return _letters(text)

    memo = SegmentMemo(encode, {"<s>": -1, "<s>x": -2, "</s>": -3})
    assert memo.encode("ab<s>xc</s>ab") == [97, 98, -2, 99, -3, 97, 98]
    assert calls == ["ab", "c"]  # the second "ab" came from memory
    assert (memo.hits, memo.misses) == (1, 2)
    assert memo.encode("<s></s>") == [-1, -3]


def test_the_memo_keeps_at_most_its_characters_and_forgets_the_oldest() -> None:
    seen: list[tuple[bool, int]] = []
    memo = SegmentMemo(_letters, {"|": 0}, max_chars=100, count=lambda hit, n: seen.append((hit, n)))
    memo.encode("a" * 10 + "|" + "b" * 10)
    assert len(memo) == 2 and memo.chars == 20
    memo.encode("c" * 11)  # longer than a tenth of max_chars: tokenized, not kept
    assert len(memo) == 2
    for i in range(10):
        memo.encode(str(i) * 10)
    assert memo.chars <= 100
    memo.encode("a" * 10)  # the oldest went first
    assert seen[-1] == (False, 10)
    memo.encode("9" * 10)
    assert seen[-1] == (True, 10)


def test_only_plain_calls_are_answered_from_memory() -> None:
    assert handles((), "x", {"add_special_tokens": False})
    assert handles((), "x", {"add_special_tokens": False, "truncation": True, "max_length": 5})
    assert not handles((), "x", {})  # special tokens added by default
    assert not handles((), ["x"], {"add_special_tokens": False})
    assert not handles(("y",), "x", {"add_special_tokens": False})
    assert not handles((), "x", {"add_special_tokens": False, "return_offsets_mapping": True})
    assert not handles((), "x", {"add_special_tokens": False, "truncation": True})
    assert not handles((), "x", {"add_special_tokens": False, "truncation": "only_second", "max_length": 3})
    assert truncated([1, 2, 3], {"truncation": True, "max_length": 2}, "right") == [1, 2]
    assert truncated([1, 2, 3], {"truncation": True, "max_length": 2}, "left") == [2, 3]
    assert truncated([1, 2, 3], {"truncation": False, "max_length": 2}, "right") == [1, 2, 3]


# -- on the model's own tokenizer ---------------------------------------------------------------

_PIECES = st.sampled_from(
    ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "|>", " ", "  ", "\n", "\t", "é", "日本", "🙂"]
)
_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=12)), max_size=12).map("".join)
_TURNS = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), _TEXT), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=_TURNS, generation=st.booleans(), raw=_TEXT)
def test_remembered_ids_are_the_tokenizers_ids(
    pair: tuple[Any, Any], turns: list[tuple[str, str]], generation: bool, raw: str
) -> None:
    remembering, plain = pair
    messages = [{"role": role, "content": content} for role, content in turns]
    text = plain.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    for prompt in (text, raw, text + raw):
        expected = plain(prompt, add_special_tokens=False)
        got = remembering(prompt, add_special_tokens=False)
        assert got["input_ids"] == expected["input_ids"]
        assert got["attention_mask"] == expected["attention_mask"]
        # Asked twice: the second answer comes from memory and is the same.
        assert remembering(prompt, add_special_tokens=False)["input_ids"] == expected["input_ids"]


@pytest.mark.parametrize("side", ["right", "left"])
def test_truncation_cuts_where_the_tokenizer_cuts(pair: tuple[Any, Any], side: str) -> None:
    remembering, plain = pair
    text = plain.apply_chat_template(
        [{"role": "system", "content": "Be brief. " * 20}, {"role": "user", "content": "hi there"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    remembering.truncation_side = plain.truncation_side = side
    try:
        for limit in (1, 7, 50, 10_000):
            kwargs = {"add_special_tokens": False, "truncation": True, "max_length": limit}
            assert remembering(text, **kwargs)["input_ids"] == plain(text, **kwargs)["input_ids"]
    finally:
        remembering.truncation_side = plain.truncation_side = "right"


def test_other_calls_go_to_the_tokenizer(pair: tuple[Any, Any]) -> None:
    remembering, plain = pair
    for kwargs in ({}, {"add_special_tokens": True}, {"return_offsets_mapping": True}):
        assert dict(remembering("<|im_start|>x y", **kwargs)) == dict(plain("<|im_start|>x y", **kwargs))
    batch = ["a b", "<|im_end|> c"]
    assert dict(remembering(batch, add_special_tokens=False)) == dict(plain(batch, add_special_tokens=False))


def test_a_token_that_strips_whitespace_leaves_the_tokenizer_as_it_was() -> None:
    from tokenizers import AddedToken

    tokenizer = _load()
    tokenizer.add_tokens([AddedToken("<sep>", lstrip=True)])
    kind = type(tokenizer)
    assert remember_segments(tokenizer) is None
    assert type(tokenizer) is kind


def test_a_pre_tokenizer_that_treats_the_first_stretch_apart_is_found_by_the_probes() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "▁x": 2, "x": 3, "▁": 4, "\n": 5, "▁\n": 6, "[UNK]": 7}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>"
    )
    assert remember_segments(tokenizer) is None
    assert type(tokenizer) is PreTrainedTokenizerFast


def test_a_tokenizer_without_added_tokens_is_left_as_it_was() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"x": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)  # type: ignore[no-untyped-call]
    assert not tokenizer.get_added_vocab()
    assert remember_segments(tokenizer) is None
    assert type(tokenizer) is PreTrainedTokenizerFast


def test_zero_characters_turns_it_off() -> None:
    tokenizer = _load()
    kind = type(tokenizer)
    assert remember_segments(tokenizer, max_chars=0) is None
    assert type(tokenizer) is kind
