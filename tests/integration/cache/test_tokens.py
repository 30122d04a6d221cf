"""Session truncation with the real SmolLM2 tokenizer (prepared by `llmesh model prepare`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from llmesh.v1 import cache_pb2

from cache.tokenizers import LocalTokenCounter, default_tokenizer_dir
from tests.integration.cache.conftest import Client, Served, assistant, serve_cache, system, user


@pytest.fixture(scope="module")
def counter() -> LocalTokenCounter:
    path = default_tokenizer_dir()
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"no prepared model at {path} (run `llmesh model prepare`)")
    return LocalTokenCounter.load(path)


@pytest.fixture(scope="module")
async def with_tokenizer(redis_url: str, counter: LocalTokenCounter) -> AsyncIterator[Served]:
    served = await serve_cache(redis_url, counter=counter)
    yield served
    await served.close()


def _template_tokens(counter: LocalTokenCounter, messages: list[tuple[str, str]]) -> int:
    rendered = [{"role": r, "content": c} for r, c in messages]
    return counter._render(rendered)


async def test_counts_match_the_chat_template(counter: LocalTokenCounter) -> None:
    from cache.domain import Turn

    turns = [
        Turn("system", "You are terse."),
        Turn("user", "Hello there!"),
        Turn("assistant", "Hi. What now?"),
    ]
    counts = await counter.count_turns(turns)
    assert sum(counts) == _template_tokens(counter, [(t.role, t.content) for t in turns])


async def test_strategies_fit_the_budget_with_real_counts(
    with_tokenizer: Served, counter: LocalTokenCounter, client: Client
) -> None:
    c = Client(stub=with_tokenizer.stub, tenant=client.tenant)
    turns = [system("You are a helpful assistant that answers briefly.")]
    for i in range(6):
        turns.append(user(f"Question number {i}: tell me something about the number {i * 7}."))
        turns.append(assistant(f"Answer {i}: it is {i * 7}.", pinned=i == 0))
    await c.call("AppendTurns", cache_pb2.AppendTurnsRequest(session_id="long", turns=turns))
    full = await c.call("GetSession", cache_pb2.GetSessionRequest(session_id="long", token_budget=100_000))
    assert not full.truncated
    assert full.token_count == _template_tokens(counter, [(_role(m), m.content) for m in full.messages])
    budget = full.token_count // 2
    for strategy in (
        cache_pb2.TRUNCATION_STRATEGY_TAIL,
        cache_pb2.TRUNCATION_STRATEGY_SYSTEM_TAIL,
        cache_pb2.TRUNCATION_STRATEGY_PINNED,
    ):
        got = await c.call(
            "GetSession",
            cache_pb2.GetSessionRequest(session_id="long", token_budget=budget, strategy=strategy),
        )
        assert got.truncated
        assert got.dropped_turns == 13 - len(got.messages)
        assert got.total_turns == 13
        assert got.token_count <= budget
        kept = [(_role(m), m.content) for m in got.messages]
        if strategy != cache_pb2.TRUNCATION_STRATEGY_TAIL:
            assert got.messages[0].content == turns[0].content
            # The token count is what the model's template really takes (system prompt first).
            assert got.token_count == _template_tokens(counter, kept)
        if strategy == cache_pb2.TRUNCATION_STRATEGY_PINNED:
            assert any(m.pinned for m in got.messages)
        assert got.messages[-1].content == turns[-1].content


def _role(message: object) -> str:
    from cache.convert import turn_from_pb

    return turn_from_pb(message).role  # type: ignore[arg-type]
