"""Several replicas on one Redis: rebuild, catch-up to a caller's floor, outages, model changes,
atomic replacement. Real model, real Redis; the replicas are in-process service cores."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import numpy as np
import pytest
import redis.asyncio as aioredis

from services.embeddings.app import EmbeddingApp, create
from services.embeddings.collections import DocumentInput
from services.embeddings.encoder import Encoded, Encoder, ModelInfo
from services.runtime import context as rc
from services.runtime.errors import FailedPrecondition, Unavailable
from services.runtime.versions import VersionStore
from tests.fixtures.context import activated
from tests.fixtures.embeddings import embeddings_settings
from tests.integration.embeddings.corpus import DOCUMENTS
from tests.integration.embeddings.proxy import CuttableProxy

pytestmark = pytest.mark.slow

MakeReplica = Callable[..., Awaitable[EmbeddingApp]]


class OtherModel:
    """A different 'model' (8 dimensions) standing in for a model change."""

    info = ModelInfo("other-model", "000000000000", 8, 128, 2)

    def encode(self, texts: Sequence[str]) -> Encoded:
        rng = np.random.default_rng(len(texts))
        vectors = rng.standard_normal((len(texts), 8)).astype(np.float32)
        return Encoded(vectors / np.linalg.norm(vectors, axis=1, keepdims=True), [3] * len(texts))

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) for t in texts]


@pytest.fixture
def tenant() -> Iterator[str]:
    name = "r-" + uuid.uuid4().hex[:12]
    with activated(rc.new_context(tenant=name)):
        yield name


def floor(collection: str, version: int) -> None:
    """Sets the current request's floor for a collection, as a caller's metadata would."""
    rc.current().floors = {"rag:" + collection: version}


def corpus(*names: str) -> list[DocumentInput]:
    return [DocumentInput(n, DOCUMENTS[n][0], DOCUMENTS[n][1]) for n in names or DOCUMENTS]


@pytest.fixture
async def make_replica(redis_url: str, embedding_encoder: Encoder) -> AsyncIterator[MakeReplica]:
    apps: list[EmbeddingApp] = []

    async def make(
        url: str = redis_url, encoder: Encoder = embedding_encoder, **settings: object
    ) -> EmbeddingApp:
        app = await create(embeddings_settings(url, **settings), encoder)
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close()


async def test_a_new_replica_rebuilds_from_redis(
    tenant: str, embeddings_app: EmbeddingApp, make_replica: MakeReplica
) -> None:
    written = await embeddings_app.collections.upsert("kb", corpus())
    for threshold in (10**6, 2):  # exact search, then an HNSW graph
        replica = await make_replica(hnsw_threshold=threshold)
        found = await replica.collections.search("kb", "Which piece moves in an L shape?", filters={})
        assert found.version == written.version
        assert found.hits[0].record.document_id == "chess"
        assert len(found.hits) == len(DOCUMENTS)


async def test_versions_live_in_the_shared_version_namespace(
    tenant: str, embeddings_app: EmbeddingApp, redis_url: str
) -> None:
    written = await embeddings_app.collections.upsert("kb", corpus("tcp"))
    client = aioredis.from_url(redis_url)
    try:
        assert await VersionStore(client).get(tenant, "rag:kb") == written.version
        bumped = await VersionStore(client).bump(tenant, "rag:kb")  # e.g. an explicit invalidation
    finally:
        await client.aclose()
    again = await embeddings_app.collections.upsert("kb", corpus("chess"))
    assert again.version > bumped > written.version
    assert rc.current().observed["rag:kb"] == again.version


async def test_lagging_replica_catches_up_to_the_callers_floor(
    tenant: str, embeddings_app: EmbeddingApp, make_replica: MakeReplica
) -> None:
    v1 = (await embeddings_app.collections.upsert("kb", corpus("tcp", "chess"))).version
    lazy = await make_replica(sync_interval_ms=3_600_000)  # re-reads Redis only when it must
    first = await lazy.collections.search("kb", "volcano eruption lava", filters={})
    assert first.version == v1
    v2 = (await embeddings_app.collections.upsert("kb", corpus("volcano"))).version
    # Without a floor the lazy replica may answer from its view (it reports the version it saw) ...
    stale = await lazy.collections.search("kb", "volcano eruption lava", filters={})
    assert stale.version == v1 and "volcano" not in {h.record.document_id for h in stale.hits}
    # ... a caller who has seen v2 never gets an older answer.
    floor("kb", v2)
    fresh = await lazy.collections.search("kb", "volcano eruption lava", filters={})
    assert fresh.version == v2 and fresh.hits[0].record.document_id == "volcano"
    assert rc.current().observed["rag:kb"] == v2


async def test_unreachable_redis_serves_only_views_that_meet_the_floor(
    tenant: str, embeddings_app: EmbeddingApp, make_replica: MakeReplica, redis_url: str
) -> None:
    proxy = CuttableProxy(redis_url)
    await proxy.start()
    v1 = (await embeddings_app.collections.upsert("kb", corpus("tcp", "chess"))).version
    replica = await make_replica(proxy.url, catchup_timeout_s=1.0)
    assert (await replica.collections.search("kb", "chess knight", filters={})).version == v1
    v2 = (await embeddings_app.collections.upsert("kb", corpus("volcano"))).version
    await proxy.cut()
    floor("kb", v1)
    served = await replica.collections.search("kb", "chess knight", filters={})
    assert served.version == v1 and served.hits[0].record.document_id == "chess"
    floor("kb", v2)
    with pytest.raises(Unavailable, match=rf"holds version {v1}, caller needs {v2}"):
        await replica.collections.search("kb", "chess knight", filters={})


async def test_replica_behind_a_trimmed_log_rebuilds(tenant: str, make_replica: MakeReplica) -> None:
    writer = await make_replica(log_max_entries=2)
    await writer.collections.upsert("kb", corpus("tcp"))
    lazy = await make_replica(sync_interval_ms=3_600_000)
    await lazy.collections.search("kb", "packets", filters={})
    for name in ("chess", "volcano", "marathon"):
        last = await writer.collections.upsert("kb", corpus(name))
    await writer.collections.delete("kb", ["tcp"])
    floor("kb", last.version)
    found = await lazy.collections.search("kb", "packets", top_k=10, filters={})
    assert found.version > last.version
    assert {h.record.document_id for h in found.hits} == {"chess", "volcano", "marathon"}


async def test_model_change_is_refused_with_a_clear_message(
    tenant: str, embeddings_app: EmbeddingApp, make_replica: MakeReplica
) -> None:
    await embeddings_app.collections.upsert("kb", corpus("tcp"))
    other = await make_replica(encoder=OtherModel(), model_name="other-model")
    message = (
        r"holds vectors of model 'all-MiniLM-L6-v2' \(dimension 384\); this service embeds with 'other-model'"
    )
    with pytest.raises(FailedPrecondition, match=message):
        await other.collections.upsert("kb", [DocumentInput("x", "Some text.", {})])
    with pytest.raises(FailedPrecondition, match=message):
        await other.collections.search("kb", "packets", filters={})


async def test_concurrent_reupserts_leave_exactly_one_version_of_a_document(
    tenant: str, embeddings_app: EmbeddingApp, make_replica: MakeReplica
) -> None:
    def version_text(n: int) -> str:
        # Version n has n + 1 paragraphs, so a mix of two writes would show as extra or missing chunks.
        return "\n\n".join(f"Revision {n} paragraph {p} of the shared document." for p in range(n + 1))

    await asyncio.gather(
        *(
            embeddings_app.collections.upsert(
                "kb",
                [DocumentInput("doc", version_text(n), {"rev": str(n)})],
                max_tokens=16,
                overlap_tokens=1,
            )
            for n in range(6)
        )
    )
    found = await (await make_replica()).collections.search("kb", "shared document", top_k=100, filters={})
    revisions = {h.record.metadata["rev"] for h in found.hits}
    assert len(revisions) == 1
    [rev] = revisions
    assert sorted(h.record.index for h in found.hits) == list(range(int(rev) + 1))
    assert all(h.record.text.startswith(f"Revision {rev} ") for h in found.hits)


async def test_a_search_out_of_time_while_the_replica_loads_is_unavailable_and_loading_goes_on(
    tenant: str, embeddings_app: EmbeddingApp, make_replica: MakeReplica
) -> None:
    written = await embeddings_app.collections.upsert("kb", corpus())
    replica = await make_replica()
    rc.current().deadline = time.monotonic()  # the caller has no time left to wait for the load
    with pytest.raises(Unavailable, match="is being loaded on this replica"):
        await replica.collections.search("kb", "chess knight", filters={})
    rc.current().deadline = None
    found = await replica.collections.search("kb", "chess knight", filters={})
    assert found.version == written.version and found.hits[0].record.document_id == "chess"


async def test_least_recently_searched_collections_are_evicted_and_reload(
    tenant: str, embeddings_app: EmbeddingApp, make_replica: MakeReplica
) -> None:
    for name in ("a", "b"):
        await embeddings_app.collections.upsert(name, corpus())
    replica = await make_replica(max_resident_chunks=len(DOCUMENTS) + 1)
    await replica.collections.search("a", "chess knight", filters={})
    await replica.collections.search("b", "chess knight", filters={})
    assert replica.replicas.held_version(tenant, "a") == 0  # evicted: only one collection fits
    found = await replica.collections.search("a", "chess knight", filters={})
    assert found.hits[0].record.document_id == "chess"
    assert replica.replicas.held_version(tenant, "b") == 0
