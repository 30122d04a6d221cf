"""Prompt tokenization that remembers the text between special tokens.

A chat prompt is its messages rendered by the chat template, joined by the template's special
tokens (``<|im_start|>``, ``<|im_end|>``, ...), and a fast tokenizer splits the text on those
tokens before anything else: each stretch between two of them is encoded on its own, and the
prompt's ids are the stretches' ids with the special tokens' ids in between. So a stretch seen
before (a system prompt every request carries, the earlier turns of a conversation sent again)
has the same ids again, and :class:`SegmentMemo` keeps them: a request pays for the text it
brings new. Byte-level BPE costs ~0.35 µs of CPU per character on the bench hosts, so a
1,000-character system prompt was ~0.4 ms of every request and a 30,000-character conversation
~10 ms of every turn.

Exactness: that split is how the tokenizer itself works only when no added token strips the
whitespace beside it, matches only whole words, or matches normalized text, and when the
pre-tokenizer treats every stretch alike (a Metaspace pre-tokenizer that prepends only to the
first one does not). :func:`remember_segments` checks the flags, then compares the two on probe
prompts rendered by the model's own template, and leaves the tokenizer as it was on any
difference. A call it does not handle (another argument, special tokens to add, a batch) goes
to the tokenizer as before.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jinja2 import TemplateError

log = logging.getLogger(__name__)

# Characters of remembered text (~3.5 bytes of memory each with their ids); a stretch longer than a
# tenth of it is encoded each time.
DEFAULT_MAX_CHARS = 4_000_000
# The tokenizer arguments a remembered encoding answers (vLLM's renderer passes these).
_HANDLED = frozenset({"add_special_tokens", "truncation", "max_length"})


class SegmentMemo:
    """Ids of text split on special tokens, each stretch's ids remembered (module doc).

    ``encode``: the tokenizer's own encoding of a text without special tokens added;
    ``specials``: every added token's text and id (all of them split the text, as the
    tokenizer splits it); ``count(remembered, chars)`` is told of every stretch; thread-safe
    (vLLM tokenizes on a pool of threads).
    """

    def __init__(
        self,
        encode: Callable[[str], Sequence[int]],
        specials: Mapping[str, int],
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        count: Callable[[bool, int], None] | None = None,
    ) -> None:
        if not specials:
            raise ValueError("no special tokens to split on")
        self._encode = encode
        self._specials = dict(specials)
        # Longest first: at one position the longest token matches, as in the tokenizer.
        alternatives = sorted(self._specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")")
        self.max_chars = max_chars
        self._longest = max_chars // 10
        self._held: OrderedDict[str, array[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.count = count
        # What it did (tests and metrics read these).
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._chars = 0
            self.hits = self.misses = 0

    @property
    def chars(self) -> int:
        return self._chars

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, part in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(self._specials[part])
            elif part:
                ids.extend(self._stretch(part))
        return ids

    def _stretch(self, text: str) -> Sequence[int]:
        with self._lock:
            held = self._held.get(text)
            if held is not None:
                self._held.move_to_end(text)
                self.hits += 1
        if held is not None:
            if self.count is not None:
                self.count(True, len(text))
            return held
        ids = array("i", self._encode(text))  # 4 bytes an id
        if self.count is not None:
            self.count(False, len(text))
        with self._lock:
            self.misses += 1
            if len(text) <= self._longest and text not in self._held:
                self._held[text] = ids
                self._chars += len(text)
                while self._chars > self.max_chars:
                    old, _ = self._held.popitem(last=False)
                    self._chars -= len(old)
        return ids


def handles(args: tuple[Any, ...], text: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether a tokenizer call is one a remembered encoding answers exactly: one text, no
    special tokens added, at most a plain truncation to ``max_length``."""
    if args or not isinstance(text, str) or not kwargs.keys() <= _HANDLED:
        return False
    if kwargs.get("add_special_tokens", True):
        return False
    truncation = kwargs.get("truncation", False)
    if truncation not in (False, True, None, "longest_first", "do_not_truncate"):
        return False
    return not (truncation in (True, "longest_first") and not isinstance(kwargs.get("max_length"), int))


def truncated(ids: list[int], kwargs: Mapping[str, Any], side: str) -> list[int]:
    """``ids`` cut as the tokenizer cuts one text to ``max_length`` (``side``: its
    ``truncation_side``)."""
    limit = kwargs.get("max_length")
    if kwargs.get("truncation") not in (True, "longest_first") or limit is None or len(ids) <= limit:
        return ids
    return ids[:limit] if side == "right" else ids[len(ids) - limit :]


def split_is_exact(tokenizer: Any) -> str:
    """Why the tokenizer's split on added tokens is not a plain split ("" when it is)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "get_added_tokens_decoder"):
        return "not a fast tokenizer"
    if getattr(tokenizer, "split_special_tokens", False):
        return "it splits special tokens"
    normalizer = backend.normalizer
    for token in backend.get_added_tokens_decoder().values():
        if token.lstrip or token.rstrip or token.single_word:
            return f"added token {token.content!r} strips whitespace or matches whole words"
        if token.normalized and normalizer is not None:
            return f"added token {token.content!r} matches normalized text"
    return ""


def _probes(tokenizer: Any, chat_template: str | None) -> list[str]:
    """Prompts rendered by the model's template whose stretches begin and end in every way a
    real one may: spaces, newlines, a special token's text inside a message, other scripts."""
    contents = [
        "Hello",
        " leading space and trailing space ",
        "\n\nnew lines\n",
        "tabs\tand  double  spaces",
        "Ünïcödé, 日本語のテキスト, emoji 🙂, ZWJ 👩‍💻",
        "code: `def f(x):\n    return x` and <|im_start|> in the text <|im_end|>",
        "a" * 300,
        "",
        "1234567890 3.14 -- ... !!! ???",
    ]
    kwargs: dict[str, Any] = {"tokenize": False}
    if chat_template:
        kwargs["chat_template"] = chat_template
    prompts = []
    for i in range(len(contents)):
        turns = [
            {"role": "system", "content": contents[i]},
            {"role": "user", "content": contents[(i + 1) % len(contents)]},
            {"role": "assistant", "content": contents[(i + 2) % len(contents)]},
            {"role": "user", "content": contents[(i + 3) % len(contents)]},
        ]
        for generation in (True, False):
            try:
                prompt = tokenizer.apply_chat_template(turns, add_generation_prompt=generation, **kwargs)
            except (ValueError, TypeError, KeyError, TemplateError):
                continue  # a template that refuses these turns (roles, order): no probe from them
            prompts.append(prompt)
    specials = list(tokenizer.get_added_vocab())
    prompts += [" ".join(specials), "".join(specials) + " x", " x".join(specials) + "\n", "x".join(specials)]
    return [p for p in prompts if isinstance(p, str)]


def remember_segments(
    tokenizer: Any,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    chat_template: str | None = None,
    count: Callable[[bool, int], None] | None = None,
) -> SegmentMemo | None:
    """Makes ``tokenizer``'s calls that :func:`handles` answer from a :class:`SegmentMemo`,
    after checking the split is exact for it (module doc); None, and the tokenizer as it was,
    when it is not, or when ``max_chars`` is 0."""
    if max_chars <= 0:
        return None
    why = split_is_exact(tokenizer)
    if why:
        log.info("prompt tokens are not remembered: %s", why)
        return None
    specials = tokenizer.get_added_vocab()
    if not specials:
        log.info("prompt tokens are not remembered: the tokenizer has no added tokens to split on")
        return None
    from transformers import BatchEncoding

    # A copy of its own: nothing else sets truncation or padding on it between two calls.
    backend = copy.deepcopy(tokenizer._tokenizer)
    backend.no_truncation()
    backend.no_padding()
    memo = SegmentMemo(
        lambda text: backend.encode(text, add_special_tokens=False).ids,
        specials,
        max_chars=max_chars,
    )
    for prompt in _probes(tokenizer, chat_template):
        expected = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if memo.encode(prompt) != expected:
            log.warning("prompt tokens are not remembered: the split differs on %r", prompt[:80])
            return None
    memo.clear()
    memo.count = count
    base = type(tokenizer)
    call = base.__call__

    def __call__(self: Any, text: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not handles(args, text, kwargs):
            return call(self, text, *args, **kwargs)
        ids = truncated(memo.encode(text), kwargs, getattr(self, "truncation_side", "right"))
        return BatchEncoding({"input_ids": ids, "attention_mask": [1] * len(ids)})

    tokenizer.__class__ = type(f"Remembering{base.__name__}", (base,), {"__call__": __call__})
    return memo
