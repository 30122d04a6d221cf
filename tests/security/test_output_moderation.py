"""Every field of an answer that carries model text is moderated (issue 14, row 1): logprobs and
top_logprobs go out only with the text they spell (held back with it, dropped when it is redacted
or blocked), tool-call arguments are checked, every choice of n > 1, and /v1/completions too.

The real gateway over HTTP (the OpenAI SDK), the real policy and cache services on Redis, a fake
inference replica whose scripted answers carry an e-mail address (redacted by the default
ruleset) or a blocked topic, with one logprob entry per word.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest_asyncio
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageFunctionToolCall

from tests.fixtures.fake_inference import MODEL
from tests.fixtures.gateway import RunningGateway
from tests.integration.gateway.conftest import (  # noqa: F401  (fixtures)
    Tenant,
    gateway,
    tenant,
    upstreams,
)

CONTACT = "who to contact?"  # -> "write to alice@example.com today"
HARMFUL = "how to do it?"  # -> "step one is to build a pipe bomb at home and then"
TWO = "two contacts?"  # n=2 -> "nobody to name here" / "write to bob@example.com today"
SECRETS = ("alice", "bob@", "example.com")
BLOCKED = ("pipe", "bomb")
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "send_note",
            "description": "Sends a note.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
]


@pytest_asyncio.fixture(loop_scope="session")
async def client(gateway: RunningGateway, tenant: Tenant) -> AsyncIterator[openai.AsyncOpenAI]:  # noqa: F811
    async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=tenant.key, max_retries=0) as sdk:
        yield sdk


def _messages(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def _leaks(tokens: list[str], words: tuple[str, ...]) -> list[str]:
    return [t for t in tokens if any(w in t for w in words)]


class Streamed:
    """One streamed choice as the client saw it, checking as it goes that no logprob token went
    out before the text it spells (held back with it)."""

    def __init__(self) -> None:
        self.text = ""
        self.tokens: list[str] = []
        self.finish: str | None = None
        self.arguments = ""
        self.calls = 0

    def add(self, text: str, tokens: list[str], finish: str | None) -> None:
        self.text += text
        for token in tokens:
            assert token.strip() in self.text, (
                f"logprob token {token!r} went out before its text: {self.text!r}"
            )
        self.tokens += tokens
        self.finish = finish or self.finish


async def _chat_stream(client: openai.AsyncOpenAI, text: str, **extra: Any) -> dict[int, Streamed]:
    stream = await client.chat.completions.create(
        model=MODEL, messages=_messages(text), stream=True, logprobs=True, top_logprobs=1, **extra
    )
    choices: dict[int, Streamed] = {}
    async for chunk in stream:
        assert isinstance(chunk, ChatCompletionChunk)
        for choice in chunk.choices:
            seen = choices.setdefault(choice.index, Streamed())
            tokens: list[str] = []
            for lp in (choice.logprobs.content or []) if choice.logprobs else []:
                tokens.append(lp.token)
                tokens += [top.token for top in lp.top_logprobs]
            for call in choice.delta.tool_calls or []:
                seen.calls += 1
                seen.arguments += (call.function.arguments or "") if call.function else ""
                # Tool-call tokens go out with (after) their moderated call.
                seen.text += (call.function.arguments or "") if call.function else ""
            seen.add(choice.delta.content or "", tokens, choice.finish_reason)
    return choices


async def test_stream_logprobs_never_spell_a_redacted_address(client: openai.AsyncOpenAI) -> None:
    choice = (await _chat_stream(client, CONTACT))[0]
    assert choice.text.startswith("write to") and "alice" not in choice.text
    assert choice.finish == "stop"
    assert not _leaks(choice.tokens, SECRETS), choice.tokens


async def test_blocked_stream_logprobs_hold_nothing_of_the_blocked_text(client: openai.AsyncOpenAI) -> None:
    choice = (await _chat_stream(client, HARMFUL))[0]
    assert choice.finish == "content_filter"
    assert not _leaks([choice.text], BLOCKED)
    assert not _leaks(choice.tokens, BLOCKED), choice.tokens


async def test_stream_every_choice_of_n_is_moderated(client: openai.AsyncOpenAI) -> None:
    choices = await _chat_stream(client, TWO, n=2)
    clean, redacted = choices[0], choices[1]
    assert clean.text == "nobody to name here"
    assert "".join(t for t in clean.tokens[::2]) == clean.text  # every token kept (token, top, ...)
    assert redacted.text.startswith("write to") and "bob@" not in redacted.text
    assert not _leaks(redacted.tokens, SECRETS), redacted.tokens


async def test_whole_answer_logprobs_dropped_when_redacted(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL, messages=_messages(TWO), n=2, logprobs=True, top_logprobs=1
    )
    clean, redacted = sorted(reply.choices, key=lambda c: c.index)
    assert clean.message.content == "nobody to name here"
    assert clean.logprobs is not None and clean.logprobs.content
    assert "".join(lp.token for lp in clean.logprobs.content) == clean.message.content
    assert redacted.message.content is not None and "bob@" not in redacted.message.content
    assert not (redacted.logprobs and redacted.logprobs.content), redacted.logprobs


async def test_whole_answer_blocked_has_no_logprobs(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(model=MODEL, messages=_messages(HARMFUL), logprobs=True)
    choice = reply.choices[0]
    assert choice.finish_reason == "content_filter"
    assert not (choice.logprobs and choice.logprobs.content)


async def test_tool_call_arguments_are_redacted_and_blocked(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL, messages=_messages(CONTACT), tools=TOOLS, tool_choice="auto", logprobs=True
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    arguments = call.function.arguments
    assert "alice" not in arguments
    assert json.loads(arguments)["text"].startswith("write to <")  # redacted, still valid JSON
    assert not (choice.logprobs and choice.logprobs.content)  # its tokens spelled the address
    blocked = await client.chat.completions.create(
        model=MODEL, messages=_messages(HARMFUL), tools=TOOLS, tool_choice="auto"
    )
    assert blocked.choices[0].finish_reason == "content_filter"
    assert not blocked.choices[0].message.tool_calls


async def test_streamed_tool_call_arguments_are_redacted_and_blocked(client: openai.AsyncOpenAI) -> None:
    choice = (await _chat_stream(client, CONTACT, tools=TOOLS, tool_choice="auto"))[0]
    assert choice.finish == "tool_calls"
    assert "alice" not in choice.arguments
    assert json.loads(choice.arguments)["text"].startswith("write to <")
    assert not _leaks(choice.tokens, SECRETS), choice.tokens
    blocked = (await _chat_stream(client, HARMFUL, tools=TOOLS, tool_choice="auto"))[0]
    assert blocked.finish == "content_filter"
    assert blocked.calls == 0 and not _leaks(blocked.tokens, BLOCKED), blocked.tokens


async def test_completions_text_and_logprobs_are_moderated(client: openai.AsyncOpenAI) -> None:
    reply = await client.completions.create(model=MODEL, prompt=[CONTACT, TWO], n=2, logprobs=1)
    by_index = {c.index: c for c in reply.choices}
    for i in (0, 1, 3):  # both choices of the first prompt, the second choice of the second
        assert "alice" not in by_index[i].text and "bob@" not in by_index[i].text
        logprobs = by_index[i].logprobs
        assert logprobs is None or not logprobs.tokens, logprobs
    clean = by_index[2]
    assert clean.text == "nobody to name here"
    assert clean.logprobs is not None and "".join(clean.logprobs.tokens or []) == clean.text

    for prompt, words in ((CONTACT, SECRETS), (HARMFUL, BLOCKED)):
        stream = await client.completions.create(model=MODEL, prompt=prompt, stream=True, logprobs=1)
        seen = Streamed()
        async for chunk in stream:
            for choice in chunk.choices:
                tokens = list(choice.logprobs.tokens or []) if choice.logprobs else []
                seen.add(choice.text, tokens, choice.finish_reason)
        assert not _leaks([seen.text, *seen.tokens], words), (seen.text, seen.tokens)
    assert seen.finish == "content_filter"
