"""Semantic cache on the real models (all-MiniLM-L6-v2, the same-question cross-encoders):
verified hits, swaps and other languages never hit, replicas, embeddings down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from llmesh.v1 import cache_pb2, common_pb2
from prometheus_client import REGISTRY

from cache.clients import GrpcEmbedder, GrpcVerifier
from cache.embedder import LocalEmbedder
from services.runtime.channels import connect
from tests.fixtures.ports import free_port
from tests.integration.cache.conftest import Client, Served, answer, key, serve_cache, system, user

HIT, MISS = common_pb2.CACHE_STATUS_HIT, common_pb2.CACHE_STATUS_MISS


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    return LocalEmbedder()


@pytest.fixture(scope="module")
async def replicas(redis_url: str, embedder: LocalEmbedder) -> AsyncIterator[tuple[Served, Served]]:
    # A generous embedding timeout: the model shares two cores with the rest of the suite.
    a = await serve_cache(redis_url, embedder=embedder, embeddings_timeout_s=10.0)
    b = await serve_cache(redis_url, embedder=embedder, embeddings_timeout_s=10.0)
    yield a, b
    await a.close()
    await b.close()


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _decided(language: str, decision: str) -> float:
    return _metric("llmesh_cache_semantic_candidates_total", language=language, decision=decision)


def _lookup(text: str, context: str = "You are terse.") -> cache_pb2.LookupResponseRequest:
    return cache_pb2.LookupResponseRequest(key=key([system(context), user(text)]))


async def _store(c: Client, text: str, reply: str) -> Any:
    """Stores ``reply`` for ``text`` (after the usual system prompt) with the semantic opt-in."""
    return await c.call(
        "StoreResponse",
        cache_pb2.StoreResponseRequest(key=key([system("You are terse."), user(text)]), entry=answer(reply)),
        semantic=True,
    )


async def test_paraphrase_hits_near_miss_is_rejected_on_every_replica(
    replicas: tuple[Served, Served], client: Client
) -> None:
    a, b = replicas
    ca = Client(stub=a.stub, tenant=client.tenant)
    cb = Client(stub=b.stub, tenant=client.tenant)
    stored = await ca.call(
        "StoreResponse",
        cache_pb2.StoreResponseRequest(
            key=key([system("You are terse."), user("What is the capital of France?")]), entry=answer("Paris")
        ),
        semantic=True,
    )
    assert stored.stored and not stored.detail, stored.detail
    hit = await ca.call("LookupResponse", _lookup("Which city is the capital of France?"), semantic=True)
    assert hit.status == HIT, hit.detail
    assert hit.semantic
    assert hit.similarity >= a.app.settings.semantic_threshold
    assert hit.entry.choices[0].text == "Paris"
    assert ca.trailers["x-llmesh-cache-status"] == "HIT"
    # Without the opt-in, only exact hits.
    assert (await ca.call("LookupResponse", _lookup("Which city is the capital of France?"))).status == MISS
    near = await ca.call("LookupResponse", _lookup("What is the capital of Germany?"), semantic=True)
    assert near.status == MISS
    # Another conversation context is another partition.
    other = await ca.call(
        "LookupResponse", _lookup("Which city is the capital of France?", "Answer in French."), semantic=True
    )
    assert other.status == MISS
    # Another tenant never sees it.
    stranger = Client(stub=a.stub, tenant=client.tenant + "-x")
    assert (
        await stranger.call("LookupResponse", _lookup("Which city is the capital of France?"), semantic=True)
    ).status == MISS
    # Replica B learns the entry from the shared semantic log.
    index_b = b.app.service.semantic.index  # type: ignore[union-attr]
    for _ in range(500):
        if len(index_b) >= len(a.app.service.semantic.index):  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    hit_b = await cb.call("LookupResponse", _lookup("Which city is the capital of France?"), semantic=True)
    assert hit_b.status == HIT
    assert hit_b.semantic


async def test_semantic_candidate_obeys_invalidation(replicas: tuple[Served, Served], client: Client) -> None:
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    k = key([system("You are terse."), user("How do I reverse a list in Python?")], scope="kb")
    await c.call(
        "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer("reversed()")), semantic=True
    )
    paraphrase = cache_pb2.LookupResponseRequest(
        key=key([system("You are terse."), user("What's the way to reverse a Python list?")], scope="kb")
    )
    assert (await c.call("LookupResponse", paraphrase, semantic=True)).status == HIT
    await c.call("Invalidate", cache_pb2.InvalidateRequest(namespace="response:kb"))
    after = await c.call("LookupResponse", paraphrase, semantic=True)
    assert after.status == MISS
    assert "moved on" in after.detail


async def test_embeddings_down_skips_semantic_and_reports_it(redis_url: str) -> None:
    dead = GrpcEmbedder(await connect(f"127.0.0.1:{free_port()}"), timeout_s=0.3)
    served = await serve_cache(redis_url, embedder=dead)
    try:
        c = Client(stub=served.stub, tenant="t-embed-down")
        k = key([user("exact still works")])
        await c.call(
            "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer("yes")), semantic=True
        )
        hit = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k), semantic=True)
        assert hit.status == HIT

        def down() -> float:
            return sum(
                _metric("llmesh_cache_semantic_skipped_total", reason=reason, language="")
                for reason in ("embeddings_failed", "embeddings_timeout")
            )

        before = down()
        miss = await c.call(
            "LookupResponse",
            cache_pb2.LookupResponseRequest(key=key([user("something else")])),
            semantic=True,
        )
        assert miss.status == MISS
        assert "semantic lookup skipped" in miss.detail
        assert down() == before + 1
    finally:
        await served.close()
        await dead.close()


@pytest.mark.parametrize(
    ("cached", "asked"),
    [
        ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
        ("Is Python faster than Java?", "Is Java faster than Python?"),
        ("How do I move money from my savings to my checking account?",
         "How do I move money from my checking to my savings account?"),
        ("Translate this from French into German.", "Translate this from German into French."),
        ("Does Alice owe Bob money?", "Does Bob owe Alice money?"),  # same words, other order
        ("Can a manager fire an employee without notice?",
         "Can an employee fire a manager without notice?"),  # two words trade places
        ("Can an employer sue an employee for breaking a non-compete?",
         "Can an employee sue an employer for breaking a non-compete?"),  # one letter apart
        ("Who defeated Caesar at Pharsalus?", "Whom did Caesar defeat at Pharsalus?"),  # subject/object
    ],
)  # fmt: skip
async def test_a_swapped_argument_pair_never_hits(
    replicas: tuple[Served, Served], client: Client, cached: str, asked: str
) -> None:
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    stored = await _store(c, cached, "x")
    assert stored.stored
    refused = _decided("en", "guard") + _decided("en", "not_verified")
    miss = await c.call("LookupResponse", _lookup(asked), semantic=True)
    assert miss.status == MISS
    assert "rejected" in miss.detail
    # Counted by the stage that refused it: the guard or the verifier.
    assert _decided("en", "guard") + _decided("en", "not_verified") >= refused + 1


async def test_other_languages_are_partitions_of_their_own(
    replicas: tuple[Served, Served], client: Client
) -> None:
    """A cross-language paraphrase is out of scope: the prompts are never compared. Languages not
    enabled (LLMESH_CACHE_SEMANTIC_LANGUAGES, default English) get exact hits only."""
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    await _store(c, "How do I reset my password?", "Settings")
    skipped = _metric("llmesh_cache_semantic_skipped_total", reason="language_off", language="de")
    german = await c.call("LookupResponse", _lookup("Wie setze ich mein Passwort zurück?"), semantic=True)
    assert german.status == MISS
    assert "language 'de' is not enabled" in german.detail
    # Counted per language, so an operator sees how much traffic enabling German would reach.
    assert _metric("llmesh_cache_semantic_skipped_total", reason="language_off", language="de") == skipped + 1


async def test_the_guard_reads_each_enabled_language_on_its_own_terms(
    redis_url: str, embedder: LocalEmbedder, client: Client
) -> None:
    """With German and Chinese enabled: a German capital marks no name (the verifier decides a
    German paraphrase), and Chinese, written without spaces, has its changed and exchanged
    stretches of text found (Guangzhou for Shanghai; Beijing and Shanghai trading places)."""
    served = await serve_cache(
        redis_url, embedder=embedder, embeddings_timeout_s=10.0, semantic_languages=["en", "de", "zh"]
    )
    try:
        c = Client(stub=served.stub, tenant=client.tenant)
        await _store(c, "Wie ändere ich mein Netflix-Passwort?", "Konto > Passwort")
        german = await c.call(
            "LookupResponse", _lookup("Wie kann ich das Passwort von Netflix ändern?"), semantic=True
        )
        assert "named entities differ" not in german.detail
        assert german.status == HIT or "verifier" in german.detail, german.detail
        await _store(c, "\u4ece\u5317\u4eac\u5230\u4e0a\u6d77\u5750\u9ad8\u94c1\u8981\u591a\u4e45", "4.5 h")
        for asked, reason in (
            ("\u4ece\u5317\u4eac\u5230\u5e7f\u5dde\u5750\u9ad8\u94c1\u8981\u591a\u4e45", "one word changed"),
            ("\u4ece\u4e0a\u6d77\u5230\u5317\u4eac\u5750\u9ad8\u94c1\u8981\u591a\u4e45", "roles swapped"),
        ):
            miss = await c.call("LookupResponse", _lookup(asked), semantic=True)
            assert miss.status == MISS
            assert reason in miss.detail, miss.detail
    finally:
        await served.close()


async def test_other_languages_are_verified_by_the_multilingual_verifier(
    redis_url: str, embedder: LocalEmbedder, client: Client
) -> None:
    """A German paraphrase hits, scored by same-question-multilingual-v1 with its own threshold;
    a German question asking for the opposite, and an English paraphrase, do not go to it."""
    served = await serve_cache(
        redis_url, embedder=embedder, embeddings_timeout_s=10.0, semantic_languages=["en", "de", "fr"]
    )
    try:
        settings = served.app.settings
        c = Client(stub=served.stub, tenant=client.tenant)
        await _store(c, "Wie kann ich mein Passwort ändern?", "Einstellungen > Sicherheit")
        verified, batches = (
            _decided("de", "verified"),
            _metric("llmesh_cache_semantic_verify_seconds_count", verifier="same-question-multilingual-v1"),
        )
        hit = await c.call("LookupResponse", _lookup("Wie ändere ich mein Passwort?"), semantic=True)
        assert hit.status == HIT, hit.detail
        assert hit.verifier == "same-question-multilingual-v1"
        assert hit.verifier_score >= settings.semantic_multilingual_verifier_threshold
        # The cache service's metrics say which stage decided, per language, and what a batch cost.
        assert _decided("de", "verified") == verified + 1
        assert (
            _metric("llmesh_cache_semantic_verify_seconds_count", verifier="same-question-multilingual-v1")
            == batches + 1
        )
        miss = await c.call(
            "LookupResponse", _lookup("Warum kann ich mein Passwort nicht ändern?"), semantic=True
        )
        assert miss.status == MISS
        assert "verifier same-question-multilingual-v1 scored" in miss.detail or "negation" in miss.detail
        await _store(c, "How do I change my password?", "Settings > Security")
        english = await c.call("LookupResponse", _lookup("How can I change my password?"), semantic=True)
        assert english.status == HIT, english.detail
        assert english.verifier in ("same-question-v1", "same-words")
    finally:
        await served.close()


async def test_semantic_hit_says_how_it_matched(replicas: tuple[Served, Served], client: Client) -> None:
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    await _store(c, "How do I undo the last commit in Git?", "reset")
    hit = await c.call(
        "LookupResponse", _lookup("How can I revert my most recent Git commit?"), semantic=True
    )
    assert hit.status == HIT, hit.detail
    assert hit.verifier == "same-question-v1"
    assert hit.verifier_score >= a.app.settings.semantic_verifier_threshold
    assert c.trailers["x-llmesh-cache-match"].startswith("semantic; similarity=")


async def test_a_repeat_in_the_same_words_hits_without_asking_the_verifier(
    replicas: tuple[Served, Served], client: Client
) -> None:
    """Typos, inflections and fillers: the same content words in the same order answer with
    ``verifier=same-words`` (no model asked); a changed word goes to the verifier."""
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    await _store(c, "How do I cancel my gym subscription?", "Settings > Billing")
    worded = _decided("en", "same_words")
    hit = await c.call(
        "LookupResponse", _lookup("um how can i cancle my gym subscriptions please"), semantic=True
    )
    assert hit.status == HIT, hit.detail
    assert (hit.verifier, hit.verifier_score) == ("same-words", 1.0)
    assert _decided("en", "same_words") == worded + 1
    assert c.trailers["x-llmesh-cache-match"].endswith("; verifier=same-words; score=1.000")
    other = await c.call("LookupResponse", _lookup("How do I cancel my gym membership?"), semantic=True)
    assert other.verifier != "same-words"
    assert other.status == MISS or other.verifier == "same-question-v1", other.detail


async def test_an_abbreviation_of_a_name_is_the_same_name(
    replicas: tuple[Served, Served], client: Client
) -> None:
    """ "JS" in one prompt and "JavaScript" in the other name one thing: the guard lets the pair
    through and the verifier decides."""
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    await _store(c, "How do I convert a string to an integer in JavaScript?", "parseInt")
    hit = await c.call(
        "LookupResponse", _lookup("In JS, what's the way to turn a string into an int?"), semantic=True
    )
    assert "named entities differ" not in hit.detail
    assert hit.status == HIT, hit.detail
    other = await c.call(
        "LookupResponse", _lookup("How do I convert a string to an integer in Java?"), semantic=True
    )
    assert other.status == MISS
    assert "named entities differ" in other.detail


async def test_one_word_changed_for_a_word_that_is_no_synonym_never_hits(
    replicas: tuple[Served, Served], client: Client
) -> None:
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    await _store(c, "Can I bring my dog on the train?", "yes")
    miss = await c.call("LookupResponse", _lookup("Can I bring my cat on the train?"), semantic=True)
    assert miss.status == MISS
    assert "one word changed: cat/dog" in miss.detail


async def test_semantic_hit_through_the_real_embedding_service(
    redis_url: str, embeddings_address: str
) -> None:
    """The deployed path: vectors from EmbeddingService.Embed, verification from ScorePairs."""
    embedder = await GrpcEmbedder.connect(embeddings_address, timeout_s=10.0)
    served = await serve_cache(
        redis_url, embedder=embedder, embeddings_timeout_s=10.0, semantic_languages=["en", "de"]
    )
    assert isinstance(served.app.service.semantic.verifier, GrpcVerifier)  # type: ignore[union-attr]
    try:
        c = Client(stub=served.stub, tenant="t-grpc-embed")
        k = key([system("You are terse."), user("How do I reverse a list in Python?")])
        stored = await c.call(
            "StoreResponse",
            cache_pb2.StoreResponseRequest(key=k, entry=answer("reversed()")),
            semantic=True,
        )
        assert stored.stored and not stored.detail, stored.detail
        hit = await c.call(
            "LookupResponse", _lookup("What's the way to reverse a Python list?"), semantic=True
        )
        assert hit.status == HIT, hit.detail
        assert hit.semantic
        assert hit.verifier == "same-question-v1"
        near = await c.call("LookupResponse", _lookup("How do I reverse a string in Python?"), semantic=True)
        assert near.status == MISS
        assert "verifier" in near.detail or "rejected" in near.detail
        # A German prompt is scored by the multilingual verifier, which the service also runs.
        await _store(c, "Wie kann ich mein Passwort ändern?", "Einstellungen > Sicherheit")
        german = await c.call("LookupResponse", _lookup("Wie ändere ich mein Passwort?"), semantic=True)
        assert german.status == HIT, german.detail
        assert german.verifier == "same-question-multilingual-v1"
    finally:
        await served.close()
        await embedder.close()
