"""EmbeddingService over gRPC on the real model and a real Redis."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
from llmesh.v1 import embeddings_pb2, embeddings_pb2_grpc

from cache.defaults import SEMANTIC_MULTILINGUAL_VERIFIER_THRESHOLD
from services.embeddings.app import EmbeddingApp, create
from services.embeddings.encoder import Encoder
from services.runtime import context as rc
from services.runtime.server import build_server
from tests.fixtures.embeddings import embeddings_settings
from tests.integration.embeddings.corpus import DOCUMENTS, QUERIES

pytestmark = pytest.mark.slow


@pytest.fixture
async def stub(embeddings_address: str) -> AsyncIterator[embeddings_pb2_grpc.EmbeddingServiceAsyncStub]:
    channel = grpc.aio.insecure_channel(embeddings_address)
    yield embeddings_pb2_grpc.EmbeddingServiceStub(channel)
    await channel.close()


@pytest.fixture
def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:12]


async def call(method: Any, request: Any, tenant: str, floor: str = "") -> tuple[Any, dict[str, str]]:
    """Response and trailing metadata of one unary call."""
    metadata = [(rc.TENANT, tenant)]
    if floor:
        metadata.append((rc.CACHE_VERSION, floor))
    pending = method(request, metadata=metadata, timeout=60)
    response = await pending
    trailers = dict(await pending.trailing_metadata() or ())
    return response, trailers


async def status_of(method: Any, request: Any, tenant: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(method, request, tenant)
    return info.value.code(), info.value.details() or ""


def docs(*names: str) -> list[embeddings_pb2.Document]:
    return [embeddings_pb2.Document(id=n, text=DOCUMENTS[n][0], metadata=DOCUMENTS[n][1]) for n in names]


async def ingest(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    tenant: str,
    collection: str,
    names: tuple[str, ...] = tuple(DOCUMENTS),
) -> int:
    request = embeddings_pb2.UpsertDocumentsRequest(collection=collection, documents=docs(*names))
    response, _ = await call(stub.UpsertDocuments, request, tenant)
    return int(response.version)


async def test_embed_returns_unit_vectors_with_model_facts(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply today."]
    response, _ = await call(stub.Embed, embeddings_pb2.EmbedRequest(texts=texts), tenant)
    assert response.model == "all-MiniLM-L6-v2"
    assert response.dimension == 384 and len(response.model_revision) == 12
    assert [e.index for e in response.embeddings] == [0, 1, 2]
    vectors = np.array([list(e.values) for e in response.embeddings])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated + 0.3
    assert response.total_tokens == sum(e.token_count for e in response.embeddings)
    assert not any(e.truncated for e in response.embeddings)


async def test_oversized_text_is_truncated_or_rejected(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    long_text = "word " * 600
    response, _ = await call(stub.Embed, embeddings_pb2.EmbedRequest(texts=["short", long_text]), tenant)
    assert [e.truncated for e in response.embeddings] == [False, True]
    assert response.embeddings[1].token_count == 256
    code, details = await status_of(
        stub.Embed, embeddings_pb2.EmbedRequest(texts=["short", long_text], reject_oversized=True), tenant
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "texts[1] has 600" in details and "254 tokens" in details


async def test_concurrent_single_text_callers_each_get_their_own_vector(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str, embeddings_app: EmbeddingApp
) -> None:
    texts = [f"Caller {i} asks about topic number {i * 7} in the catalogue." for i in range(48)]
    results = await asyncio.gather(
        *(call(stub.Embed, embeddings_pb2.EmbedRequest(texts=[t]), tenant) for t in texts)
    )
    direct = embeddings_app.embedder.encoder.encode(texts).vectors
    for i, (response, _) in enumerate(results):
        got = np.array(response.embeddings[0].values)
        # Each caller's vector is the one of its own text (batching pads; allow float noise).
        assert float(got @ direct[i]) > 0.999
        others = np.delete(direct, i, axis=0) @ got
        assert float(others.max()) < float(got @ direct[i])


async def test_semantic_ordering_on_a_small_corpus(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    version = await ingest(stub, tenant, "kb")
    for query, expected in QUERIES.items():
        response, trailers = await call(
            stub.Search, embeddings_pb2.SearchRequest(collection="kb", query=query, top_k=3), tenant
        )
        assert response.hits[0].document_id == expected, query
        assert response.hits[0].score > response.hits[1].score
        assert response.version == version
        assert trailers[rc.CACHE_VERSION] == f"rag:kb={version}"


async def test_upsert_replaces_chunks_atomically_and_bumps_the_version(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    v1 = await ingest(stub, tenant, "kb", ("chess", "tcp"))
    new_text = "Knitting a scarf takes wool, two needles and patience. Start with a simple garter stitch."
    request = embeddings_pb2.UpsertDocumentsRequest(
        collection="kb",
        documents=[embeddings_pb2.Document(id="chess", text=new_text, metadata={"topic": "craft"})],
    )
    response, trailers = await call(stub.UpsertDocuments, request, tenant)
    v2 = response.version
    assert v2 > v1 and response.document_count == 1 and response.chunk_count == 1
    assert trailers[rc.CACHE_VERSION] == f"rag:kb={v2}"
    found, _ = await call(
        stub.Search, embeddings_pb2.SearchRequest(collection="kb", query="How do I knit a scarf?"), tenant
    )
    assert found.version == v2
    assert found.hits[0].document_id == "chess" and found.hits[0].text == new_text
    assert found.hits[0].metadata == {"topic": "craft"}
    assert all("bishop" not in h.text for h in found.hits)
    listing, _ = await call(stub.ListCollections, embeddings_pb2.ListCollectionsRequest(), tenant)
    [info] = listing.collections
    assert (info.name, info.document_count, info.chunk_count, info.version) == ("kb", 2, 2, v2)
    assert (info.model, info.dimension) == ("all-MiniLM-L6-v2", 384)


async def test_delete_removes_documents(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    v1 = await ingest(stub, tenant, "kb")
    response, _ = await call(
        stub.DeleteDocuments,
        embeddings_pb2.DeleteDocumentsRequest(collection="kb", document_ids=["tcp", "no-such-doc"]),
        tenant,
    )
    assert response.deleted_count == 1 and response.version > v1
    found, _ = await call(
        stub.Search,
        embeddings_pb2.SearchRequest(collection="kb", query="dropped packets congestion", top_k=10),
        tenant,
    )
    assert "tcp" not in {h.document_id for h in found.hits} and len(found.hits) == len(DOCUMENTS) - 1
    again, _ = await call(
        stub.DeleteDocuments,
        embeddings_pb2.DeleteDocumentsRequest(collection="kb", document_ids=["tcp"]),
        tenant,
    )
    assert again.deleted_count == 0 and again.version == response.version  # nothing changed, no bump


async def test_filters_and_score_threshold(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    await ingest(stub, tenant, "kb")
    request = embeddings_pb2.SearchRequest(
        collection="kb", query="Why do plants need light?", top_k=10, filter={"topic": "cooking"}
    )
    found, _ = await call(stub.Search, request, tenant)
    assert [h.document_id for h in found.hits] == ["sourdough"]
    request = embeddings_pb2.SearchRequest(collection="kb", query="Why do plants need light?", min_score=0.4)
    found, _ = await call(stub.Search, request, tenant)
    assert [h.document_id for h in found.hits] == ["photosynthesis"]
    assert found.hits[0].chunk_id == "photosynthesis#0" and found.hits[0].chunk_index == 0


async def test_long_document_is_chunked_on_sentence_boundaries(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    sentences = [f"Fact number {i} says that the value of item {i} is {i * 3} units." for i in range(40)]
    text = " ".join(sentences[:20]) + "\n\n" + " ".join(sentences[20:])
    request = embeddings_pb2.UpsertDocumentsRequest(
        collection="long",
        documents=[embeddings_pb2.Document(id="facts", text=text)],
        chunking=embeddings_pb2.ChunkingOptions(max_tokens=64, overlap_tokens=16),
    )
    response, _ = await call(stub.UpsertDocuments, request, tenant)
    assert response.chunk_count > 4
    found, _ = await call(
        stub.Search, embeddings_pb2.SearchRequest(collection="long", query="item 33", top_k=100), tenant
    )
    chunks = sorted(found.hits, key=lambda h: h.chunk_index)
    assert [h.chunk_index for h in chunks] == list(range(response.chunk_count))
    for hit in chunks:
        # Whole sentences only: every chunk starts and ends on a sentence boundary.
        assert hit.text.startswith("Fact number") and hit.text.endswith("units.")
    for first, second in itertools.pairwise(chunks):
        # Consecutive chunks of a paragraph overlap by one whole sentence (14 tokens; two do not
        # fit the 16-token overlap); a chunk that starts the second paragraph carries no overlap.
        first_facts = [int(x.split()[0]) for x in first.text.split("Fact number ")[1:]]
        second_facts = [int(x.split()[0]) for x in second.text.split("Fact number ")[1:]]
        if second_facts[0] == 20:
            assert first_facts[-1] == 19
        else:
            assert second_facts[0] == first_facts[-1]
    covered = {int(x.split()[0]) for h in chunks for x in h.text.split("Fact number ")[1:]}
    assert covered == set(range(40))


@pytest.mark.parametrize(
    ("request_", "code", "text"),
    [
        (embeddings_pb2.EmbedRequest(texts=[]), grpc.StatusCode.INVALID_ARGUMENT, "texts must not be empty"),
        (
            embeddings_pb2.EmbedRequest(texts=["ok", "  "]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "texts[1] is empty",
        ),
        (embeddings_pb2.EmbedRequest(texts=["x"], model="gpt-embed"), grpc.StatusCode.NOT_FOUND, "gpt-embed"),
        (
            embeddings_pb2.UpsertDocumentsRequest(collection="kb", documents=docs("tcp", "tcp")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "duplicate document ids in one request: 'tcp'",
        ),
        (
            embeddings_pb2.UpsertDocumentsRequest(collection="kb"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "documents must not be empty",
        ),
        (
            embeddings_pb2.UpsertDocumentsRequest(collection="bad name!", documents=docs("tcp")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "collection name",
        ),
        (
            embeddings_pb2.UpsertDocumentsRequest(
                collection="kb",
                documents=docs("tcp"),
                chunking=embeddings_pb2.ChunkingOptions(max_tokens=999),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_tokens must be between 1 and 254",
        ),
        (
            embeddings_pb2.SearchRequest(collection="missing", query="anything"),
            grpc.StatusCode.NOT_FOUND,
            "collection 'missing' does not exist",
        ),
        (
            embeddings_pb2.DeleteDocumentsRequest(collection="missing", document_ids=["a"]),
            grpc.StatusCode.NOT_FOUND,
            "collection 'missing' does not exist",
        ),
        (
            embeddings_pb2.DeleteDocumentsRequest(collection="kb", document_ids=["a", "a"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "duplicate document_ids",
        ),
        (
            embeddings_pb2.SearchRequest(collection="kb", query=""),
            grpc.StatusCode.INVALID_ARGUMENT,
            "query must not be empty",
        ),
        (
            embeddings_pb2.SearchRequest(collection="kb", query="x", top_k=5000),
            grpc.StatusCode.INVALID_ARGUMENT,
            "top_k must be between 1 and 1000",
        ),
    ],
)
async def test_bad_requests_are_refused_with_the_reason(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    tenant: str,
    request_: Any,
    code: grpc.StatusCode,
    text: str,
) -> None:
    method: Any = {
        embeddings_pb2.EmbedRequest: stub.Embed,
        embeddings_pb2.UpsertDocumentsRequest: stub.UpsertDocuments,
        embeddings_pb2.SearchRequest: stub.Search,
        embeddings_pb2.DeleteDocumentsRequest: stub.DeleteDocuments,
    }[type(request_)]
    got, details = await status_of(method, request_, tenant)
    assert got == code and text in details, details


async def test_tenants_do_not_see_each_other(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    await ingest(stub, tenant, "shared-name", ("tcp",))
    code, _ = await status_of(
        stub.Search,
        embeddings_pb2.SearchRequest(collection="shared-name", query="packets"),
        tenant + "-other",
    )
    assert code == grpc.StatusCode.NOT_FOUND
    listing, _ = await call(stub.ListCollections, embeddings_pb2.ListCollectionsRequest(), tenant + "-other")
    assert list(listing.collections) == []


async def test_score_pairs_tells_a_paraphrase_from_a_near_miss(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    """The same-question cross-encoder over gRPC: one score per candidate, in order."""
    request = embeddings_pb2.ScorePairsRequest(
        query="How can I remove a Git branch?",
        candidates=[
            "How do I create a branch in Git?",
            "How do I delete a branch in Git?",
            "Is Java faster than Python?",
        ],
    )
    reply, _ = await call(stub.ScorePairs, request, tenant)
    assert reply.model == "same-question-v1"
    assert len(reply.scores) == 3
    assert all(0.0 <= s <= 1.0 for s in reply.scores)
    assert reply.scores[1] > 0.9 > reply.scores[0]
    assert reply.scores[2] < 0.1


async def test_score_pairs_runs_the_multilingual_verifier_a_call_names(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, tenant: str
) -> None:
    """Both verifiers are served; a call naming same-question-multilingual-v1 gets it."""
    request = embeddings_pb2.ScorePairsRequest(
        query="Wie kann ich mein Passwort ändern?",
        candidates=[
            "Wie ändere ich mein Passwort?",
            "Wie ändere ich meinen Benutzernamen?",
            "Warum kann ich mein Passwort nicht ändern?",
        ],
        model="same-question-multilingual-v1",
    )
    reply, _ = await call(stub.ScorePairs, request, tenant)
    assert reply.model == "same-question-multilingual-v1"
    # Above the threshold the cache holds it to for a paraphrase; below it for the others.
    threshold = SEMANTIC_MULTILINGUAL_VERIFIER_THRESHOLD
    assert reply.scores[0] >= threshold > max(reply.scores[1:]), list(reply.scores)


async def test_a_verifier_not_warmed_loads_on_the_first_call_that_names_it(
    redis_url: str, embedding_encoder: Encoder, tenant: str
) -> None:
    """By default only the first verifier loads at start: the multilingual one's 0.6 GB is
    taken when a call first names it, and that call waits for the load while calls to the
    English verifier go on."""
    app = await create(embeddings_settings(redis_url), embedding_encoder)
    server = await build_server(app.settings, [app.binding()])
    channel = grpc.aio.insecure_channel(server.address)
    try:
        stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
        scorers = app.servicer.verification.scorers
        assert scorers["same-question-v1"].loaded
        assert not scorers["same-question-multilingual-v1"].loaded
        german = asyncio.ensure_future(
            call(
                stub.ScorePairs,
                embeddings_pb2.ScorePairsRequest(
                    query="Wie kann ich mein Passwort ändern?",
                    candidates=["Wie ändere ich mein Passwort?"],
                    model="same-question-multilingual-v1",
                ),
                tenant,
            )
        )
        english, _ = await call(
            stub.ScorePairs,
            embeddings_pb2.ScorePairsRequest(query="How do I reset it?", candidates=["How can I reset it?"]),
            tenant,
        )
        assert english.model == "same-question-v1"
        assert not german.done()  # the English call did not wait for the multilingual load
        reply, _ = await german
        assert reply.model == "same-question-multilingual-v1"
        assert reply.scores[0] >= SEMANTIC_MULTILINGUAL_VERIFIER_THRESHOLD
        assert scorers["same-question-multilingual-v1"].loaded
    finally:
        await channel.close()
        await server.stop(0)
        await app.close()


@pytest.mark.parametrize(
    ("request_", "code", "phrase"),
    [
        (
            embeddings_pb2.ScorePairsRequest(query="", candidates=["x"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "query",
        ),
        (
            embeddings_pb2.ScorePairsRequest(query="q", candidates=["x"] * 17),
            grpc.StatusCode.INVALID_ARGUMENT,
            "at most 16",
        ),
        (
            embeddings_pb2.ScorePairsRequest(query="q", candidates=["x" * 8193]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "candidates[0]",
        ),
        (
            embeddings_pb2.ScorePairsRequest(query="q", candidates=["x"], model="nope"),
            grpc.StatusCode.NOT_FOUND,
            "nope",
        ),
    ],
)
async def test_score_pairs_refuses_bad_requests(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    tenant: str,
    request_: embeddings_pb2.ScorePairsRequest,
    code: grpc.StatusCode,
    phrase: str,
) -> None:
    got, details = await status_of(stub.ScorePairs, request_, tenant)
    assert got == code
    assert phrase in details
