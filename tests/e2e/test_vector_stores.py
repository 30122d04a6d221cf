"""End to end: files and vector stores with the official openai SDK against the whole mesh (real
engine, real embeddings model, real policy and cache, real Redis). Model output is never
compared to exact strings: what is checked is that the store's text reached the model."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.e2e.mesh import KEYS, Mesh

pytestmark = pytest.mark.slow

WAIT_S = 180.0
HANDBOOK = """# Project Zephyr handbook

The launch code of project Zephyr is 7391. Only the flight director may read it aloud.

## Schedule

Zephyr launches from pad 4 at dawn on the first Tuesday of the month.
"""
QUESTION = "What is the launch code of project Zephyr? Answer with the number."


def sdk(mesh: Mesh, tenant: str = "main") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=mesh.gateway.base_url, api_key=KEYS[tenant], max_retries=0, timeout=120
    )


def ask(rag: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "",
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 16,
    }
    if rag is not None:
        body["extra_body"] = {"rag": rag}
    return body


async def test_a_store_answers_a_chat_and_stays_its_tenants(mesh: Mesh) -> None:
    async with sdk(mesh) as client, sdk(mesh, "strict") as other:
        uploaded = await client.files.create(
            file=("zephyr.md", HANDBOOK.encode(), "text/markdown"), purpose="assistants"
        )
        store = await client.vector_stores.create(name="zephyr", file_ids=[uploaded.id])
        # Readiness is the file's own status, polled by the SDK's helper within a deadline.
        record = await client.vector_stores.files.poll(
            uploaded.id, vector_store_id=store.id, max_wait_seconds=WAIT_S
        )
        assert record.status == "completed", record.last_error
        assert (await client.vector_stores.retrieve(store.id)).file_counts.completed == 1

        page = await client.vector_stores.search(store.id, query="Zephyr launch code", max_num_results=3)
        assert page.data and page.data[0].file_id == uploaded.id
        assert "7391" in page.data[0].content[0].text

        with_store = await client.chat.completions.with_raw_response.create(
            **ask({"collections": [store.id], "top_k": 2})
        )
        without = await client.chat.completions.create(**ask())
        answer = with_store.parse()
        assert answer.choices[0].message.content
        assert answer.usage is not None and without.usage is not None
        # The store's chunks went into the prompt (tens of tokens of context).
        assert answer.usage.prompt_tokens > without.usage.prompt_tokens + 10
        assert f"rag:{store.id}=" in with_store.headers["x-cache-version"]

        # The second tenant sees none of it: 404s and empty lists, never 403.
        for call in (
            other.files.retrieve(uploaded.id),
            other.files.content(uploaded.id),
            other.vector_stores.retrieve(store.id),
            other.vector_stores.search(store.id, query="Zephyr launch code"),
            other.vector_stores.files.retrieve(uploaded.id, vector_store_id=store.id),
            other.vector_stores.delete(store.id),
            other.chat.completions.create(**ask({"collections": [store.id]})),
        ):
            with pytest.raises(openai.NotFoundError):
                await call
        assert store.id not in [s.id async for s in other.vector_stores.list()]
        assert uploaded.id not in [f.id async for f in other.files.list()]

        deleted = await client.vector_stores.delete(store.id)
        assert deleted.deleted
        await client.files.delete(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            await client.vector_stores.retrieve(store.id)
