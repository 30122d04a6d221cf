"""Ingestion throughput of ``llmesh bench embeddings``: the HTTP API against the service direct.

Pages (``--page-chars`` characters of the corpus each, ``--pages-per-file`` to a file) are
ingested two ways, interleaved round by round on the same embedding service process:

* direct: one UpsertDocuments call per file (the file's text as one document) straight to
  the embeddings service, ``--ingest-concurrency`` calls in flight;
* HTTP API: through a gateway process, per file ``POST /v1/files`` (multipart upload) and
  ``POST /v1/vector_stores/{id}/files`` (attach), as many requests in flight, then ``GET`` of
  the store until its ``file_counts`` say every file is ``completed``; the gateway runs as
  many ingestion jobs at once as the direct path has calls in flight.

Each path writes the same documents with the same chunking, so the ratio is what the API
adds: the upload, the file store in Redis, the job bookkeeping and the status polls. The
gateway has no policy service here (what the policy check costs is the policy benchmark's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from llmesh.v1 import embeddings_pb2, embeddings_pb2_grpc

from benchmarks.mesh_load import Child, free_port
from gateway.auth import hash_key
from services.runtime import context as rc

TENANT = "llmesh-bench"
KEY = "sk-llmesh-bench-ingest"
# How often the client asks whether the store's files are done (the last file's completion is
# seen at most this late).
POLL_S = 0.1


def pages_of(sentences: Sequence[str], count: int, page_chars: int) -> list[str]:
    """``count`` pages of about ``page_chars`` characters, consecutive corpus sentences each,
    a blank line between paragraphs of five sentences."""
    pages: list[str] = []
    source = iter(sentences)
    for _ in range(count):
        sentences_on_page: list[str] = []
        size = 0
        while size < page_chars:
            sentence = next(source, None)
            if sentence is None:
                source = iter(sentences)
                sentence = next(source)
            sentences_on_page.append(sentence)
            size += len(sentence) + 1
        paragraphs = [" ".join(sentences_on_page[i : i + 5]) for i in range(0, len(sentences_on_page), 5)]
        pages.append("\n\n".join(paragraphs))
    return pages


def files_of(pages: Sequence[str], pages_per_file: int) -> list[str]:
    return ["\n\n".join(pages[i : i + pages_per_file]) for i in range(0, len(pages), pages_per_file)]


async def _direct(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    collection: str,
    files: Sequence[str],
    concurrency: int,
) -> float:
    metadata = ((rc.TENANT, TENANT),)
    turns = asyncio.Semaphore(concurrency)

    async def one(i: int, text: str) -> None:
        async with turns:
            await stub.UpsertDocuments(
                embeddings_pb2.UpsertDocumentsRequest(
                    collection=collection,
                    documents=[
                        embeddings_pb2.Document(
                            id=f"f{i}", text=text, metadata={"file_id": f"f{i}", "filename": f"f{i}.md"}
                        )
                    ],
                ),
                metadata=metadata,
                timeout=600,
            )

    start = time.perf_counter()
    await asyncio.gather(*(one(i, t) for i, t in enumerate(files)))
    return time.perf_counter() - start


async def _http(http: httpx.AsyncClient, files: Sequence[str], concurrency: int) -> tuple[float, str]:
    """Uploads and attaches every file (``concurrency`` requests in flight), then waits until the
    store has them all ``completed``: the gateway runs ``concurrency`` jobs at once, as a client
    that attaches a batch and waits for it sees."""
    turns = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    store = (await http.post("/v1/vector_stores", json={"name": "bench"})).raise_for_status().json()["id"]

    async def one(i: int, text: str) -> None:
        async with turns:
            uploaded = await http.post(
                "/v1/files",
                files={"file": (f"f{i}.md", text.encode(), "text/markdown")},
                data={"purpose": "assistants"},
            )
            file_id = uploaded.raise_for_status().json()["id"]
            attached = await http.post(f"/v1/vector_stores/{store}/files", json={"file_id": file_id})
            attached.raise_for_status()

    await asyncio.gather(*(one(i, t) for i, t in enumerate(files)))
    deadline = time.monotonic() + 3600
    while True:
        counts = (await http.get(f"/v1/vector_stores/{store}")).raise_for_status().json()["file_counts"]
        if counts["failed"] or counts["cancelled"]:
            failed = (await http.get(f"/v1/vector_stores/{store}/files", params={"filter": "failed"})).json()
            raise RuntimeError(f"ingestion failed: {failed['data'][:1]}")
        if counts["completed"] == len(files):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"files still in progress after an hour: {counts}")
        await asyncio.sleep(POLL_S)  # the client's poll interval
    return time.perf_counter() - start, store


async def _clean_http(http: httpx.AsyncClient, store: str) -> None:
    with contextlib.suppress(httpx.HTTPError):
        await http.delete(f"/v1/vector_stores/{store}")
        listed = (await http.get("/v1/files")).json()["data"]
        for item in listed:
            await http.delete(f"/v1/files/{item['id']}")


def start_gateway(embeddings: str, redis: str, concurrency: int, logs: Path) -> tuple[Child, str]:
    """A gateway process in front of the embeddings service only (no policy, no cache; its
    inference address is a closed port: chat is not what is measured)."""
    http_port = free_port()
    env = {
        "LLMESH_GATEWAY_PORT": "0",
        "LLMESH_GATEWAY_HTTP_PORT": str(http_port),
        "LLMESH_GATEWAY_INFERENCE_ADDRESSES": f"127.0.0.1:{free_port()}",
        "LLMESH_GATEWAY_EMBEDDINGS_ADDRESS": embeddings,
        "LLMESH_GATEWAY_REDIS_URL": redis,
        "LLMESH_GATEWAY_API_KEYS": json.dumps({hash_key(KEY): TENANT}),
        "LLMESH_GATEWAY_INGEST_CONCURRENCY": str(concurrency),
        "LLMESH_GATEWAY_LOG_LEVEL": "WARNING",
    }
    child = Child.llmesh("gateway", env, logs / "gateway.log")
    return child, f"http://127.0.0.1:{http_port}"


async def ingestion(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    *,
    embeddings_address: str,
    redis: str,
    sentences: Sequence[str],
    args: Any,
    rows: list[dict[str, Any]],
    drop: Any,
) -> dict[str, float]:
    """Pages per second both ways; ``drop(collection)`` removes a collection's keys."""
    pages = pages_of(sentences, args.ingest_pages, args.page_chars)
    files = files_of(pages, args.pages_per_file)
    concurrency = args.ingest_concurrency
    logs = Path(tempfile.mkdtemp(prefix="llmesh-bench-ingest-"))
    child, base = start_gateway(embeddings_address, redis, concurrency, logs)
    rates: dict[str, list[float]] = {"direct": [], "http": []}
    try:
        async with httpx.AsyncClient(
            base_url=base, headers={"authorization": f"Bearer {KEY}"}, timeout=600
        ) as http:
            # Warm-up: one file each way (the model's first batches, the gateway's connections).
            warm = f"bench-warm-{uuid.uuid4().hex[:6]}"
            await _direct(stub, warm, files[:1], 1)
            await drop(warm)
            _, store = await _http(http, files[:1], 1)
            await _clean_http(http, store)
            await drop(store)
            for round_ in range(args.ingest_rounds):
                order = ["direct", "http"] if round_ % 2 == 0 else ["http", "direct"]
                for path in order:
                    if path == "direct":
                        collection = f"bench-direct-{uuid.uuid4().hex[:6]}"
                        wall = await _direct(stub, collection, files, concurrency)
                        await drop(collection)
                    else:
                        wall, store = await _http(http, files, concurrency)
                        await _clean_http(http, store)
                        await drop(store)
                    rates[path].append(len(pages) / wall)
                    print(
                        f"  ingestion round {round_ + 1} {path:6s} {len(pages) / wall:7.2f} pages/s",
                        flush=True,
                    )
    finally:
        child.stop()
    ratios = [h / d for h, d in zip(rates["http"], rates["direct"], strict=True)]
    shape = (
        f"{len(pages)} pages of {args.page_chars} chars, {args.pages_per_file} per file, "
        f"{concurrency} in flight"
    )
    rows.append(
        {
            "case": f"ingest direct UpsertDocuments ({shape})",
            "pages_per_s": round(statistics.median(rates["direct"]), 2),
            "per_round": [round(r, 2) for r in rates["direct"]],
            "ratio_vs_direct": 1.0,
        }
    )
    rows.append(
        {
            "case": "ingest HTTP API: upload + attach + poll until completed",
            "pages_per_s": round(statistics.median(rates["http"]), 2),
            "per_round": [round(r, 2) for r in rates["http"]],
            "ratio_vs_direct": round(statistics.median(ratios), 3),
        }
    )
    return {
        "ingest_direct_pages_per_s": round(statistics.median(rates["direct"]), 2),
        "ingest_http_pages_per_s": round(statistics.median(rates["http"]), 2),
        "ingest_http_ratio": round(statistics.median(ratios), 3),
    }
