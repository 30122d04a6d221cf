"""A stream's engine steps joined into fewer messages (services/inference/coalesce.py): the
same tokens, text, logprobs and token ids as step by step; the first word step by step; then N
steps per message and the last at once; tool calls never merged; CJK text's first word ends
where the policy's stream moderator can first cut it; other text without spaces never joined."""

from __future__ import annotations

import pytest

from policy.config import DEFAULT_RULESET
from policy.rules import parse_ruleset
from policy.stream import StreamModerator
from services.inference.coalesce import Coalescer, first_word_done
from services.inference.types import Choice, StreamChunk, TokenLogprob, ToolCall, Usage

RULESET = parse_ruleset(DEFAULT_RULESET.read_bytes(), "default").for_tenant("t")


def step(
    i: int, text: str, *, index: int = 0, finish: str = "", calls: list[ToolCall] | None = None
) -> Choice:
    return Choice(
        index=index,
        text=text,
        tool_calls=calls or [],
        finish_reason=finish,  # type: ignore[arg-type]
        logprobs=[TokenLogprob(token=text, logprob=-0.1 * i, bytes=text.encode())],
        token_ids=[i],
    )


def chunks(texts: list[str], **last: str) -> list[StreamChunk]:
    out = [StreamChunk(id="r", model="m", revision="v", deltas=[step(i, t)]) for i, t in enumerate(texts)]
    out[-1].deltas[0].finish_reason = last.get("finish", "length")  # type: ignore[assignment]
    out[-1].usage = Usage(prompt_tokens=3, completion_tokens=len(texts))
    return out


def joined(interval: int, stream: list[StreamChunk]) -> list[StreamChunk]:
    coalescer = Coalescer(interval)
    out = [message for chunk in stream for message in coalescer.add(chunk)]
    return out + list(coalescer.flush())


def sizes(messages: list[StreamChunk]) -> list[int]:
    return [len(m.deltas[0].token_ids) for m in messages]


WORDS = [
    "Un",
    "fortunately",
    ",",
    " we",
    " do",
    " not",
    " take",
    " returns",
    " after",
    " thirty",
    " days",
    ".",
]


def test_the_first_word_goes_step_by_step_then_n_steps_per_message_and_the_last_at_once() -> None:
    every = joined(1, chunks(WORDS))
    assert sizes(every) == [1] * 12
    grouped = joined(3, chunks(WORDS))
    # "Un", "fortunately", "," one by one; " we" completes the first word and goes at once.
    assert sizes(grouped) == [1, 1, 1, 1, 3, 3, 2]
    assert "".join(m.deltas[0].text for m in grouped) == "".join(WORDS)
    assert [t for m in grouped for t in m.deltas[0].token_ids] == list(range(12))
    assert [lp.token for m in grouped for lp in m.deltas[0].logprobs] == WORDS
    # The end: its finish reason and usage, in the last message only.
    assert [m.deltas[0].finish_reason for m in grouped] == [""] * 6 + ["length"]
    assert [m.usage is not None for m in grouped] == [False] * 6 + [True]


def test_an_answer_that_ends_within_a_message_ends_it() -> None:
    grouped = joined(4, chunks(["Yes", " it", " is", " fine"], finish="stop"))
    assert sizes(grouped) == [1, 1, 2]
    assert grouped[-1].deltas[0].finish_reason == "stop" and grouped[-1].usage is not None


def test_a_tool_call_goes_alone_after_what_was_held() -> None:
    stream = chunks(["Let", " me", " look", " it", " up", ""])
    call = ToolCall(id="c1", name="lookup", arguments='{"q": ', index=0)
    stream[-1].deltas[0].tool_calls = [call]
    grouped = joined(4, stream)
    assert sizes(grouped) == [1, 1, 3, 1]
    assert [bool(m.deltas[0].tool_calls) for m in grouped] == [False, False, False, True]


def test_text_without_spaces_goes_step_by_step() -> None:
    grouped = joined(4, chunks(["https", "://", "example", ".com", "/a", "/b", "/c", "/d"]))
    assert sizes(grouped) == [1] * 8


def test_cjk_text_joins_after_its_first_character_that_another_follows() -> None:
    # "我们" completes its first word at once (the moderator may release "我" at this step).
    assert sizes(joined(4, chunks(["我们", "不", "接受", "三十", "天", "后", "退货", "。"]))) == [1, 4, 3]
    # A single first character waits for the next one; Japanese and Korean alike.
    assert sizes(joined(4, chunks(["你", "好", "\uff01", "我", "是", "一个", "助手", "。"]))) == [1, 1, 4, 2]
    assert sizes(joined(2, chunks(["こ", "んにちは", "、", "元気"]))) == [1, 1, 2]
    assert sizes(joined(2, chunks(["안", "녕", "하세요", "!"]))) == [1, 1, 2]
    # A mark that attaches to the character before (a combining voiced-sound mark, a ZWJ) does
    # not end it.
    assert sizes(joined(2, chunks(["か", "\u3099", "き", "た", "よ"]))) == [1, 1, 1, 2]
    assert sizes(joined(2, chunks(["你", "\u200d", "好", "。", "的", "是"]))) == [1, 1, 1, 1, 2]


@pytest.mark.parametrize(
    "pieces",
    [
        ["你", "好", "\uff0c", "我"],
        ["我们", "不"],
        ["こ", "んにちは"],
        ["안", "녕"],
        ["か", "\u3099", "き"],
        ["你", "\u200d", "好", "。"],
        ["Hello", " world"],
        ["No", " way"],
    ],
)
def test_the_first_word_ends_where_the_moderator_first_releases_text(pieces: list[str]) -> None:
    """The step that completes the first word is the step at which the default ruleset's stream
    moderator first releases text: after it, a held step delays no first release."""
    moderator = StreamModerator(RULESET)
    released = [bool(moderator.feed(piece).text) for piece in pieces]
    ended = []
    text = ""
    for piece in pieces:
        before, text = text, text + piece
        ended.append(first_word_done(text, len(before)))
    assert ended.index(True) == released.index(True), (ended, released)


def test_each_choice_of_several_keeps_its_own_text() -> None:
    stream = [
        StreamChunk(id="r", model="m", revision="v", deltas=[step(i, a, index=0), step(i, b, index=1)])
        for i, (a, b) in enumerate([("Hi", "Hello"), (" there", ","), (" friend", " you"), ("!", "!")])
    ]
    grouped = joined(2, stream)
    # Choice 1's first word ends at step 2: steps 0-2 one by one, then 3 alone (the stream ended
    # without a finish reason: flushed).
    assert [len(m.deltas) for m in grouped] == [2, 2, 2, 2]
    assert "".join(d.text for m in grouped for d in m.deltas if d.index == 0) == "Hi there friend!"
    assert "".join(d.text for m in grouped for d in m.deltas if d.index == 1) == "Hello, you!"


def test_streams_send_on_the_engines_even_steps() -> None:
    clock = [0]
    words = ["Hi", " there", " how", " are", " you", " today", " my", " friend", "!"]
    late = Coalescer(2, lambda: clock[0])
    early = Coalescer(2, lambda: clock[0])
    sent: dict[str, list[int]] = {"early": [], "late": []}
    for step_no in range(1, 12):
        clock[0] = step_no  # the engine's step count as vLLM reports the step's outputs
        for name, coalescer, start in (("early", early, 1), ("late", late, 2)):
            i = step_no - start
            if 0 <= i < len(words):
                chunk = StreamChunk(id=name, model="m", revision="v", deltas=[step(i, words[i])])
                if i == len(words) - 1:
                    chunk.deltas[0].finish_reason = "stop"
                sent[name] += [step_no for _ in coalescer.add(chunk)]
    # Each stream: its first word step by step (2 steps), then only on even steps, and its end.
    assert sent["early"] == [1, 2, 4, 6, 8, 9]
    assert sent["late"] == [2, 3, 4, 6, 8, 10]
    # A clock that stops never holds a stream more than N steps.
    stuck = Coalescer(2, lambda: 1)
    assert sizes(joined_with(stuck, chunks(WORDS))) == [1, 1, 1, 1, 2, 2, 2, 2]


def joined_with(coalescer: Coalescer, stream: list[StreamChunk]) -> list[StreamChunk]:
    return [message for chunk in stream for message in coalescer.add(chunk)] + list(coalescer.flush())


def test_under_load_every_stream_goes_every_busy_interval_steps() -> None:
    busy = [False]
    words = ["Hi", " there", " how", " are", " you", " today", " my", " dear", " old", " friend", "!"]
    # Asked for every step; the load comes after the first word and goes again.
    coalescer = Coalescer(1, busy=lambda: busy[0], busy_interval=3)
    sent: list[int] = []
    for i, chunk in enumerate(chunks(words, finish="stop")):
        busy[0] = 2 <= i <= 7
        sent += [len(m.deltas[0].token_ids) for m in coalescer.add(chunk)]
    # "Hi" and " there" one by one (the first word), then three steps per message while busy,
    # and step by step again once the load is gone.
    assert sent == [1, 1, 3, 3, 1, 1, 1]
    # The same tokens as step by step, in order.
    again = Coalescer(1, busy=lambda: True, busy_interval=3)
    messages = joined_with(again, chunks(words, finish="stop"))
    assert [t for m in messages for t in m.deltas[0].token_ids] == list(range(len(words)))
    assert sizes(messages) == [1, 1, 3, 3, 3]
    # The first word still goes step by step under load; text without spaces never joins.
    loaded = Coalescer(2, busy=lambda: True, busy_interval=4)
    assert sizes(joined_with(loaded, chunks(WORDS))) == [1, 1, 1, 1, 4, 4]
    plain = Coalescer(1, busy=lambda: True, busy_interval=4)
    assert sizes(joined_with(plain, chunks(["https", "://", "example", ".com", "/a", "/b"]))) == [1] * 6
    # A stream that asked for more steps than the busy interval keeps its own.
    wide = Coalescer(6, busy=lambda: True, busy_interval=4)
    assert sizes(joined_with(wide, chunks(WORDS))) == [1, 1, 1, 1, 6, 2]


def test_a_load_that_ends_releases_what_it_held_first() -> None:
    busy = [True]
    coalescer = Coalescer(1, busy=lambda: busy[0], busy_interval=4)
    out = []
    for i, chunk in enumerate(chunks(["Hi", " you", " and", " me", " too", " now"])):
        busy[0] = i < 3
        out.append([len(m.deltas[0].token_ids) for m in coalescer.add(chunk)])
    # " and" held under load; at " me" the load is gone: the held step, then " me", in order.
    assert out == [[1], [1], [], [1, 1], [1], [1]]
