"""Files and vector stores through the HTTP API with the official openai SDK, on real Redis, with
fakes behind the library's Protocols for the embeddings service (collections) and the policy:
the API's shapes, limits, tenant isolation, and what ingestion leaves behind when it fails."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from gateway.auth import hash_key
from gateway.config import GatewaySettings, TenantSettings
from gateway.vector_stores.collections import Chunking, Hit
from gateway.vector_stores.documents import Part, part_id
from gateway.vector_stores.extract import Kind
from gateway.vector_stores.ingest import STOPPED
from gateway.vector_stores.library import Library
from gateway.vector_stores.policy import DocumentBlocked
from services.runtime import context as rc
from tests.fixtures.fake_inference import FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway

BLOCKED_WORD = "FORBIDDEN"
WAIT_S = 15.0


class FakeCollections:
    """Collections in memory, scoped by the request context's tenant as the real service does."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], dict[str, Part]] = {}
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.deleted = asyncio.Event()
        self.fail_on_call: int | None = None
        # Hold after writing: a write that landed but whose call has not returned yet.
        self.hold_after_write = False
        self.calls = 0
        self.chunking: list[Chunking | None] = []

    def collection(self, name: str) -> dict[str, Part]:
        return self.docs.setdefault((rc.current().tenant, name), {})

    def file_docs(self, tenant: str, name: str, file_id: str) -> list[str]:
        return [d for d in self.docs.get((tenant, name), {}) if d.startswith(file_id + ".")]

    async def upsert(self, collection: str, parts: Sequence[Part], chunking: Chunking | None) -> int:
        self.calls += 1
        self.chunking.append(chunking)
        if self.fail_on_call is not None and self.calls >= self.fail_on_call:
            raise RuntimeError("the fake embeddings service failed this write")
        if self.hold_after_write:
            self.collection(collection).update({p.id: p for p in parts})
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        self.collection(collection).update({p.id: p for p in parts})
        return len(parts)

    async def delete(self, collection: str, document_ids: Sequence[str]) -> None:
        docs = self.collection(collection)
        for document_id in document_ids:
            docs.pop(document_id, None)
        self.deleted.set()

    async def search(
        self, collection: str, query: str, top_k: int, min_score: float, filters: Mapping[str, str]
    ) -> list[Hit]:
        words = set(query.lower().split())
        hits = []
        for part in self.collection(collection).values():
            if any(part.metadata.get(k) != v for k, v in filters.items()):
                continue
            score = len(words & set(part.text.lower().replace(".", "").split())) / len(words)
            if score > 0 and score >= min_score:
                hits.append(Hit(part.text, score, part.id, part.metadata))
        return sorted(hits, key=lambda h: h.score, reverse=True)[:top_k]


class FakePolicy:
    async def check(self, texts: Sequence[str], fail_open: bool) -> None:
        if any(BLOCKED_WORD in t for t in texts):
            raise DocumentBlocked(["no-forbidden"], ["Forbidden words are not stored."])


@dataclass
class Env:
    gw: RunningGateway
    fakes: FakeCollections
    settings: GatewaySettings
    tenants: dict[str, str]  # role -> tenant name
    keys: dict[str, str]  # role -> API key
    redis_url: str

    def client(self, role: str = "alpha") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.gw.base_url, api_key=self.keys[role], max_retries=0)

    @property
    def library(self) -> Library:
        assert self.gw.gateway.library is not None
        return self.gw.gateway.library


@pytest.fixture(scope="module")
async def env(redis_url: str) -> AsyncIterator[Env]:
    fake = FakeInference("r1")
    server = await start_fake(fake)
    suffix = uuid.uuid4().hex[:8]
    roles = ("alpha", "beta", "gamma")
    tenants = {r: f"{r}-{suffix}" for r in roles}
    keys = {r: f"sk-{r}-{suffix}" for r in roles}
    settings = GatewaySettings(
        inference_addresses=[server.address],
        redis_url=redis_url,
        api_keys={hash_key(keys[r]): tenants[r] for r in roles},
        tenants={tenants[r]: TenantSettings() for r in roles},
        files_max_bytes=16 * 1024,
        files_tenant_quota_bytes=40 * 1024,
        ingest_lease_s=0.6,
        ingest_part_chars=1000,
        ingest_call_chars=1000,
    )
    async with serve_gateway(settings) as running:
        assert running.gateway.library is not None
        await running.gateway.library.close()
        fakes = FakeCollections()
        library = Library(settings, aioredis.Redis.from_url(redis_url), fakes, FakePolicy())
        library.start()
        running.gateway.library = library
        yield Env(running, fakes, settings, tenants, keys, redis_url)
    await server.stop(0)


async def upload(
    client: openai.AsyncOpenAI, name: str, text: str, content_type: str = "text/markdown"
) -> str:
    created = await client.files.create(file=(name, text.encode(), content_type), purpose="assistants")
    return created.id


async def completed(client: openai.AsyncOpenAI, store_id: str, file_id: str) -> str:
    """Polls the attached file's status (the SDK's helper, bounded) until it is no longer in_progress."""
    record = await client.vector_stores.files.poll(file_id, vector_store_id=store_id, max_wait_seconds=WAIT_S)
    return record.status


async def test_file_lifecycle(env: Env) -> None:
    async with env.client() as client:
        created = await client.files.create(
            file=("notes/guide.md", b"# Guide\n\nBoots can be returned within 30 days.", "text/markdown"),
            purpose="assistants",
        )
        assert created.id.startswith("file-") and created.object == "file"
        assert created.filename == "guide.md" and created.bytes == 46 and created.status == "processed"
        assert (await client.files.retrieve(created.id)).model_dump() == created.model_dump()
        listed = [f.id async for f in client.files.list()]
        assert created.id in listed
        content = await client.files.content(created.id)
        assert content.content == b"# Guide\n\nBoots can be returned within 30 days."
        deleted = await client.files.delete(created.id)
        assert deleted.deleted and deleted.id == created.id
        with pytest.raises(openai.NotFoundError) as caught:
            await client.files.retrieve(created.id)
        error = caught.value.body
        assert isinstance(error, dict) and "no such file" in error["message"]


async def test_file_list_pages_in_order(env: Env) -> None:
    async with env.client("beta") as client:
        ids = [await upload(client, f"p{i}.txt", f"page {i}", "text/plain") for i in range(3)]
        first = await client.files.list(limit=2, order="asc")
        assert [f.id for f in first.data] == ids[:2] and first.has_more
        rest = await client.files.list(limit=2, order="asc", after=ids[1])
        assert [f.id for f in rest.data] == ids[2:] and not rest.has_more
        newest = await client.files.list(limit=1)
        assert newest.data[0].id == ids[-1]
        assert [f.id async for f in client.files.list(limit=1, order="asc")] == ids
        for file_id in ids:
            await client.files.delete(file_id)


@pytest.mark.parametrize(
    ("name", "data", "content_type", "purpose", "status", "words"),
    [
        ("photo.png", b"\x89PNG....", "image/png", "assistants", 400, "unsupported file type"),
        ("report.pdf", b"<html></html>", "text/html", "assistants", 400, "extension '.pdf'"),
        ("report.pdf", b"not really a pdf", "application/pdf", "assistants", 400, "not a PDF"),
        ("latin1.txt", b"caf\xe9", "text/plain", "assistants", 400, "not UTF-8"),
        ("train.md", b"data", "text/markdown", "fine-tune", 400, "purpose: 'fine-tune' is not supported"),
        ("big.txt", b"x" * (16 * 1024 + 1), "text/plain", "assistants", 413, "over the limit of 16384"),
    ],
)
async def test_upload_refusals_name_the_problem(
    env: Env, name: str, data: bytes, content_type: str, purpose: str, *, status: int, words: str
) -> None:
    async with env.client() as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.files.create(file=(name, data, content_type), purpose=purpose)  # type: ignore[arg-type]
    assert caught.value.status_code == status
    body = caught.value.body
    assert isinstance(body, dict) and words in body["message"], body
    assert body["type"] == "invalid_request_error"


async def test_upload_past_the_body_limit_is_413_before_the_route(env: Env) -> None:
    # The upload's body limit is files_max_bytes plus room for the multipart framing (64 KiB).
    # The blocking client, in a thread: it reads the answer after its write fails (the gateway
    # closes the connection without reading the rest), where the asyncio transport drops it.
    def post() -> httpx.Response:
        with httpx.Client(base_url=env.gw.url, timeout=30) as http:
            return http.post(
                "/v1/files",
                files={"file": ("huge.txt", b"x" * 1_000_000, "text/plain")},
                data={"purpose": "assistants"},
                headers={"authorization": f"Bearer {env.keys['alpha']}"},
            )

    reply = await asyncio.to_thread(post)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large"


async def test_expires_after_is_refused(env: Env) -> None:
    async with env.client() as client:
        with pytest.raises(openai.BadRequestError, match="expires_after"):
            await client.files.create(
                file=("a.txt", b"text", "text/plain"),
                purpose="assistants",
                expires_after={"anchor": "created_at", "seconds": 3600},
            )


async def test_tenant_quota(env: Env) -> None:
    async with env.client("gamma") as client:
        ids = [await upload(client, f"q{i}.txt", "y" * 15 * 1024, "text/plain") for i in range(2)]
        with pytest.raises(openai.RateLimitError, match="quota of 40960 bytes"):
            await upload(client, "q3.txt", "y" * 15 * 1024, "text/plain")
        await client.files.delete(ids[0])  # gives the bytes back
        ids[0] = await upload(client, "q3.txt", "y" * 15 * 1024, "text/plain")
        for file_id in ids:
            await client.files.delete(file_id)


async def test_store_ingests_searches_and_pages(env: Env) -> None:
    async with env.client() as client:
        boots = await upload(client, "boots.md", "Boots can be returned within 30 days.\n\nKeep the receipt.")
        hats = await upload(client, "hats.html", "<p>Hats are final sale.</p>", "text/html")
        store = await client.vector_stores.create(
            name="policies", file_ids=[boots], metadata={"team": "shop"}
        )
        assert (
            store.object == "vector_store" and store.name == "policies" and store.metadata == {"team": "shop"}
        )
        assert store.file_counts.total == 1
        attached = await client.vector_stores.files.create_and_poll(
            hats, vector_store_id=store.id, attributes={"kind": "hat", "year": 2024}, max_wait_seconds=WAIT_S
        )
        assert attached.status == "completed" and attached.last_error is None
        assert attached.attributes == {"kind": "hat", "year": 2024}
        assert await completed(client, store.id, boots) == "completed"
        store = await client.vector_stores.retrieve(store.id)
        assert store.status == "completed" and store.usage_bytes > 0
        assert (store.file_counts.completed, store.file_counts.in_progress, store.file_counts.total) == (
            2,
            0,
            2,
        )

        page = await client.vector_stores.search(store.id, query="can boots be returned", max_num_results=5)
        results = page.data
        assert results[0].file_id == boots and results[0].filename == "boots.md"
        assert results[0].content[0].type == "text" and "30 days" in results[0].content[0].text
        filtered = await client.vector_stores.search(
            store.id, query="hats final sale", filters={"type": "eq", "key": "kind", "value": "hat"}
        )
        assert [r.file_id for r in filtered.data] == [hats]
        assert filtered.data[0].attributes == {"kind": "hat", "year": 2024}
        with pytest.raises(openai.BadRequestError, match="'gt' is not supported"):
            await client.vector_stores.search(
                store.id, query="x", filters={"type": "gt", "key": "year", "value": 2000}
            )

        files = await client.vector_stores.files.list(store.id, limit=1, order="asc")
        assert [f.id for f in files.data] == [boots] and files.has_more
        files = await client.vector_stores.files.list(store.id, limit=1, order="asc", after=boots)
        assert [f.id for f in files.data] == [hats] and not files.has_more
        assert [f.id async for f in client.vector_stores.files.list(store.id, filter="failed")] == []
        text = [c.text async for c in client.vector_stores.files.content(boots, vector_store_id=store.id)]
        assert text == ["Boots can be returned within 30 days.\n\nKeep the receipt."]

        renamed = await client.vector_stores.update(store.id, name="shop policies")
        assert renamed.name == "shop policies"
        second = await client.vector_stores.create(name="other")
        listed = await client.vector_stores.list(limit=1)
        assert [s.id for s in listed.data] == [second.id] and listed.has_more
        listed = await client.vector_stores.list(limit=5, after=second.id)
        assert store.id in [s.id for s in listed.data]

        # Detaching deletes the file's documents; deleting the store deletes the rest.
        tenant = env.tenants["alpha"]
        assert env.fakes.file_docs(tenant, store.id, hats)
        removed = await client.vector_stores.files.delete(hats, vector_store_id=store.id)
        assert removed.deleted and removed.object == "vector_store.file.deleted"
        assert not env.fakes.file_docs(tenant, store.id, hats)
        assert (await client.vector_stores.retrieve(store.id)).file_counts.total == 1
        gone = await client.vector_stores.delete(store.id)
        assert gone.deleted and gone.object == "vector_store.deleted"
        assert not env.fakes.docs.get((tenant, store.id))
        with pytest.raises(openai.NotFoundError):
            await client.vector_stores.retrieve(store.id)
        await client.vector_stores.delete(second.id)
        for file_id in (boots, hats):
            await client.files.delete(file_id)


async def test_static_chunking_reaches_the_embeddings_service(env: Env) -> None:
    async with env.client() as client:
        file_id = await upload(client, "c.txt", "chunk me", "text/plain")
        store = await client.vector_stores.create(name="chunked")
        record = await client.vector_stores.files.create_and_poll(
            file_id,
            vector_store_id=store.id,
            chunking_strategy={
                "type": "static",
                "static": {"max_chunk_size_tokens": 120, "chunk_overlap_tokens": 20},
            },
            max_wait_seconds=WAIT_S,
        )
        assert record.status == "completed"
        assert env.fakes.chunking[-1] == Chunking(120, 20)
        assert record.chunking_strategy is not None and record.chunking_strategy.type == "static"
        with pytest.raises(openai.BadRequestError, match="chunk_overlap_tokens"):
            await client.vector_stores.files.create(
                store.id,
                file_id=file_id,
                chunking_strategy={
                    "type": "static",
                    "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 100},
                },
            )
        await client.vector_stores.delete(store.id)


async def test_policy_block_fails_the_attach_with_the_reason(env: Env) -> None:
    async with env.client() as client:
        bad = await upload(client, "bad.md", f"Fine words.\n\nThen {BLOCKED_WORD} words.")
        store = await client.vector_stores.create(name="checked", file_ids=[bad])
        assert await completed(client, store.id, bad) == "failed"
        record = await client.vector_stores.files.retrieve(bad, vector_store_id=store.id)
        assert record.last_error is not None and record.last_error.code == "invalid_file"
        assert "no-forbidden" in record.last_error.message and "Forbidden words" in record.last_error.message
        counts = (await client.vector_stores.retrieve(store.id)).file_counts
        assert (counts.failed, counts.in_progress, counts.completed) == (1, 0, 0)
        assert not env.fakes.file_docs(env.tenants["alpha"], store.id, bad)
        await client.vector_stores.delete(store.id)


async def test_a_failed_write_leaves_nothing_and_a_retry_completes(env: Env) -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 150 for i in range(4))  # 4 parts, 4 calls
    async with env.client() as client:
        file_id = await upload(client, "long.txt", text, "text/plain")
        store = await client.vector_stores.create(name="atomic")
        env.fakes.calls, env.fakes.fail_on_call = 0, 3
        try:
            record = await client.vector_stores.files.create_and_poll(
                file_id, vector_store_id=store.id, max_wait_seconds=WAIT_S
            )
        finally:
            env.fakes.fail_on_call = None
        assert record.status == "failed" and record.last_error is not None
        assert record.last_error.code == "server_error" and "RuntimeError" in record.last_error.message
        assert env.fakes.calls >= 3
        assert not env.fakes.file_docs(env.tenants["alpha"], store.id, file_id)  # calls 1 and 2 undone
        again = await client.vector_stores.files.create_and_poll(
            file_id, vector_store_id=store.id, max_wait_seconds=WAIT_S
        )
        assert again.status == "completed" and again.last_error is None
        assert len(env.fakes.file_docs(env.tenants["alpha"], store.id, file_id)) == 4
        counts = (await client.vector_stores.retrieve(store.id)).file_counts
        assert (counts.failed, counts.completed, counts.total) == (0, 1, 1)
        await client.vector_stores.delete(store.id)
        await client.files.delete(file_id)


async def test_another_tenant_sees_nothing(env: Env) -> None:
    async with env.client() as alpha, env.client("beta") as beta:
        file_id = await upload(alpha, "private.md", "Alpha's private plans.")
        store = await alpha.vector_stores.create(name="private", file_ids=[file_id])
        assert await completed(alpha, store.id, file_id) == "completed"
        own_store = await beta.vector_stores.create(name="beta's")
        not_found: list[Awaitable[object]] = [
            beta.files.retrieve(file_id),
            beta.files.content(file_id),
            beta.files.delete(file_id),
            beta.vector_stores.retrieve(store.id),
            beta.vector_stores.update(store.id, name="stolen"),
            beta.vector_stores.search(store.id, query="plans"),
            beta.vector_stores.files.retrieve(file_id, vector_store_id=store.id),
            beta.vector_stores.files.create(store.id, file_id=file_id),
            beta.vector_stores.files.create(own_store.id, file_id=file_id),
            beta.vector_stores.files.delete(file_id, vector_store_id=store.id),
            beta.vector_stores.delete(store.id),
        ]
        for call in not_found:
            with pytest.raises(openai.NotFoundError) as caught:
                await call
            assert caught.value.status_code == 404
        assert file_id not in [f.id async for f in beta.files.list()]
        assert store.id not in [s.id async for s in beta.vector_stores.list()]
        with pytest.raises(openai.NotFoundError):
            await anext(aiter(beta.vector_stores.files.list(store.id)))
        # Alpha's are untouched.
        assert (await alpha.vector_stores.retrieve(store.id)).name == "private"
        assert (await alpha.vector_stores.search(store.id, query="private plans")).data
        await alpha.vector_stores.delete(store.id)
        await beta.vector_stores.delete(own_store.id)
        await alpha.files.delete(file_id)


async def test_detach_while_ingesting_deletes_what_the_job_writes(env: Env) -> None:
    fakes = env.fakes
    async with env.client() as client:
        file_id = await upload(client, "slow.md", "Slow file.")
        store = await client.vector_stores.create(name="racing")
        fakes.hold, fakes.entered, fakes.deleted = asyncio.Event(), asyncio.Event(), asyncio.Event()
        try:
            record = await client.vector_stores.files.create(store.id, file_id=file_id)
            assert record.status == "in_progress"
            await asyncio.wait_for(fakes.entered.wait(), WAIT_S)  # the job is writing
            await client.vector_stores.files.delete(file_id, vector_store_id=store.id)
            fakes.deleted.clear()
        finally:
            fakes.hold.set()
            fakes.hold = None
        # The job's write lands after the detach: the job finds it lost the file and deletes it.
        await asyncio.wait_for(fakes.deleted.wait(), WAIT_S)
        assert not fakes.file_docs(env.tenants["alpha"], store.id, file_id)
        with pytest.raises(openai.NotFoundError):
            await client.vector_stores.files.retrieve(file_id, vector_store_id=store.id)
        assert (await client.vector_stores.retrieve(store.id)).file_counts.total == 0
        await client.vector_stores.delete(store.id)
        await client.files.delete(file_id)


async def test_a_dead_gateways_job_is_failed_by_the_next_reader(env: Env) -> None:
    tenant = env.tenants["alpha"]
    async with env.client() as client:
        file_id = await upload(client, "orphan.md", "Orphaned text.")
        store = await client.vector_stores.create(name="orphans")
        # A job of a gateway that died after writing: recorded, never renewed, documents written.
        repo = env.library.stores
        assert (
            await repo.attach(tenant, store.id, file_id, job="deadbeef", attributes={}, chunking=None)
            == "created"
        )
        assert await repo.heartbeat(tenant, store.id, file_id, "deadbeef", parts=1)
        orphan = part_id(file_id, "deadbeef", 0)
        env.fakes.docs.setdefault((tenant, store.id), {})[orphan] = Part(orphan, "Orphaned text.", {})
        record = await client.vector_stores.files.poll(
            file_id, vector_store_id=store.id, max_wait_seconds=WAIT_S
        )
        assert record.status == "failed" and record.last_error is not None
        assert (
            record.last_error.code == "server_error" and "ingestion interrupted" in record.last_error.message
        )
        assert orphan not in env.fakes.docs[(tenant, store.id)]
        counts = (await client.vector_stores.retrieve(store.id)).file_counts
        assert (counts.in_progress, counts.failed) == (0, 1)
        await client.vector_stores.delete(store.id)
        await client.files.delete(file_id)


async def test_a_stopping_gateway_fails_its_jobs_and_deletes_their_writes(env: Env) -> None:
    tenant = env.tenants["alpha"]
    fakes = FakeCollections()
    fakes.hold, fakes.hold_after_write = asyncio.Event(), True
    stopping = Library(env.settings, aioredis.Redis.from_url(env.redis_url), fakes, FakePolicy())
    stopping.start()
    reader = env.library
    stored = await reader.files.create(
        tenant, filename="s.md", purpose="assistants", data=b"Stopping.", kind=Kind.MARKDOWN, text="Stopping."
    )
    store = await reader.stores.create(tenant, "stopping", {})
    try:
        await stopping.attach(tenant, store.id, stored.id, attributes={}, chunking=None, fail_open=False)
        await asyncio.wait_for(fakes.entered.wait(), WAIT_S)
        assert fakes.file_docs(tenant, store.id, stored.id)  # written, the call not returned yet
        await stopping.close()  # the gateway stops mid-call
    finally:
        fakes.hold.set()
    record = await reader.stores.get_file(tenant, store.id, stored.id)
    assert record.status == "failed" and record.error_code == "server_error"
    assert record.error_message == STOPPED
    assert not fakes.file_docs(tenant, store.id, stored.id)
    await reader.delete_store(tenant, store.id)
    await reader.files.delete(tenant, stored.id)
