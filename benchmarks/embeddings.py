"""``llmesh bench embeddings``: throughput against sentence-transformers, search latency and recall.

In one run, interleaved round by round so that noise from other work on the
machine hits every contender alike:

* direct: sentence-transformers ``encode`` in this process, batches of 64;
* service, batch-64 calls: Embed calls of 64 sentences, one call in flight;
* service, single callers: 64 concurrent callers, one sentence per Embed call
  (dynamic batching coalesces them).

Ingestion throughput (pages per second) through the gateway's HTTP API (files upload,
vector store attach, wait for completed) against UpsertDocuments called directly, side by
side in the same rounds (:mod:`benchmarks.embeddings_ingest`).

The service runs as its own process (``python -m services.embeddings``), as in
production; the client side uses llmesh's channel. Then, per collection size,
the corpus is written to Redis with precomputed vectors (ingestion is not what is
timed), the service loads it on the first search, and held-out queries measure
end-to-end Search latency (query embedding included) and recall@10 against an
exact search over the same vectors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np
from llmesh.v1 import embeddings_pb2, embeddings_pb2_grpc

from benchmarks import embeddings_corpus, embeddings_ingest
from benchmarks.harness import BenchReport, summarize_ms
from services.embeddings.config import EmbeddingsSettings
from services.embeddings.encoder import ModelInfo, Vectors, default_model_path
from services.embeddings.index import ChunkRecord, IndexParams, VectorIndex
from services.embeddings.store import CollectionStore, PreparedDocument, collections_key
from services.runtime import context as rc
from services.runtime import redis_client
from services.runtime.channels import connect
from services.runtime.settings import redis_url

TENANT = "llmesh-bench"
QUERIES = 200
THROUGHPUT_TEXTS = 1280
BATCH = 64


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmesh bench embeddings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved throughput rounds")
    parser.add_argument("--texts", type=int, default=THROUGHPUT_TEXTS, help="sentences per throughput run")
    parser.add_argument("--sizes", default="10000,100000", help="collection sizes (chunks), comma separated")
    parser.add_argument("--queries", type=int, default=QUERIES)
    parser.add_argument("--redis-url", default=redis_url())
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true", help="no ingestion throughput section")
    parser.add_argument("--ingest-pages", type=int, default=200, help="pages ingested per path and round")
    parser.add_argument("--page-chars", type=int, default=3000, help="characters of one page")
    parser.add_argument("--pages-per-file", type=int, default=10)
    parser.add_argument("--ingest-concurrency", type=int, default=4, help="files in flight (both paths)")
    parser.add_argument("--ingest-rounds", type=int, default=3, help="interleaved ingestion rounds")
    parser.add_argument(
        "--vectors",
        choices=["auto", "model", "static"],
        default="auto",
        help="corpus vectors: the model's (computed once and cached: slow on CPU), static ones, or the "
        "model's where cached (default)",
    )
    return parser.parse_args(list(argv))


class ServiceProcess:
    """``python -m services.embeddings`` on a free port; stopped with SIGTERM."""

    def __init__(self, redis: str, extra_env: dict[str, str] | None = None) -> None:
        env = {
            **os.environ,
            "LLMESH_EMBEDDINGS_PORT": "0",
            "LLMESH_EMBEDDINGS_REDIS_URL": redis,
            "LLMESH_EMBEDDINGS_LOG_LEVEL": os.environ.get("LLMESH_EMBEDDINGS_LOG_LEVEL", "WARNING"),
            **(extra_env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.embeddings"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = 0
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith("LLMESH_READY") and not ready.is_set():
                    self.port = int(line.rsplit("port=", 1)[1])
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or not self.port:
            self.stop()
            raise RuntimeError("the embedding service did not start (see its log above)")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _direct(model: Any, texts: Sequence[str]) -> float:
    start = time.perf_counter()
    for i in range(0, len(texts), BATCH):
        model.encode(
            list(texts[i : i + BATCH]), batch_size=BATCH, normalize_embeddings=True, show_progress_bar=False
        )
    return len(texts) / (time.perf_counter() - start)


async def _service_batches(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, texts: Sequence[str]
) -> float:
    start = time.perf_counter()
    for i in range(0, len(texts), BATCH):
        await stub.Embed(embeddings_pb2.EmbedRequest(texts=texts[i : i + BATCH]))
    return len(texts) / (time.perf_counter() - start)


async def _service_singles(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub, texts: Sequence[str], callers: int = BATCH
) -> float:
    pending = iter(texts)

    async def caller() -> None:
        for text in pending:
            await stub.Embed(embeddings_pb2.EmbedRequest(texts=[text]))

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return len(texts) / (time.perf_counter() - start)


async def _throughput(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    model: Any,
    texts: Sequence[str],
    rounds: int,
    rows: list[dict[str, Any]],
) -> dict[str, float]:
    await _service_batches(stub, texts[:BATCH])  # warm both sides up
    _direct(model, texts[:BATCH])
    rates: dict[str, list[float]] = {"direct": [], "batch": [], "single": []}
    for _ in range(rounds):
        rates["direct"].append(_direct(model, texts))
        rates["batch"].append(await _service_batches(stub, texts))
        rates["single"].append(await _service_singles(stub, texts))
    batch_ratios = [b / d for b, d in zip(rates["batch"], rates["direct"], strict=True)]
    single_ratios = [s / d for s, d in zip(rates["single"], rates["direct"], strict=True)]
    labels = {
        "direct": "sentence-transformers direct, batch 64",
        "batch": "service, batch-64 Embed calls (1 in flight)",
        "single": f"service, {BATCH} concurrent single-sentence callers",
    }
    for key, label in labels.items():
        ratios = {"batch": batch_ratios, "single": single_ratios}.get(key)
        rows.append(
            {
                "case": label,
                "sentences_per_s": round(statistics.median(rates[key]), 1),
                "per_round": [round(r, 1) for r in rates[key]],
                "ratio_vs_direct": round(statistics.median(ratios), 3) if ratios else 1.0,
            }
        )
    return {
        "batch_throughput_ratio": round(statistics.median(batch_ratios), 3),
        "single_caller_throughput_ratio": round(statistics.median(single_ratios), 3),
    }


async def _ingest(
    store: CollectionStore, model: ModelInfo, collection: str, texts: Sequence[str], vecs: Vectors
) -> None:
    for start in range(0, len(texts), 1000):
        documents = [
            PreparedDocument(f"s{i}", {"shard": str(i % 10)}, [texts[i]], vecs[i : i + 1])
            for i in range(start, min(start + 1000, len(texts)))
        ]
        await store.upsert(TENANT, collection, model, documents)


async def _drop(client: Any, collection: str) -> None:
    tag = "{" + TENANT + ":rag:" + collection + "}"
    await client.delete(*(f"llmesh:rag:{tag}:{part}" for part in ("meta", "docs", "chunks", "vecs", "log")))
    await client.srem(collections_key(TENANT), collection)


def _recall(size: int, corpus: Vectors, queries: Vectors, rows: list[dict[str, Any]]) -> float:
    """recall@10 of the index the service builds (same parameters) against exact search, in process."""
    settings = EmbeddingsSettings()
    index = VectorIndex(
        corpus.shape[1],
        IndexParams(
            hnsw_threshold=settings.hnsw_threshold,
            hnsw_m=settings.hnsw_m,
            ef_construction=settings.hnsw_ef_construction,
            ef_search=settings.hnsw_ef_search,
            exact_filter_limit=settings.exact_filter_limit,
        ),
    )
    start = time.perf_counter()
    for first in range(0, size, 500):
        index.apply(
            [
                (f"s{i}", [ChunkRecord(f"s{i}", 0, "", {})], corpus[i : i + 1])
                for i in range(first, min(size, first + 500))
            ]
        )
    build_s = time.perf_counter() - start
    found = 0
    latencies = []
    for q in queries:
        exact = np.argpartition(-(corpus @ q), 10)[:10]
        t0 = time.perf_counter()
        hits = index.search(q, 10)
        latencies.append(time.perf_counter() - t0)
        found += len({f"s{i}" for i in exact.tolist()} & {h.record.document_id for h in hits})
    recall = found / (10 * len(queries))
    lat = summarize_ms(latencies)
    rows.append(
        {
            "case": f"index only, {size} chunks",
            "index": "hnsw" if index.uses_hnsw else "exact",
            "build_s": round(build_s, 1),
            "search_p50_ms": lat["p50_ms"],
            "search_p99_ms": lat["p99_ms"],
            "recall_at_10": round(recall, 4),
        }
    )
    return recall


async def _search_case(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    size: int,
    *,
    store: CollectionStore,
    client: Any,
    model: ModelInfo,
    corpus: tuple[Sequence[str], Vectors],
    queries: Sequence[str],
    rows: list[dict[str, Any]],
) -> dict[str, float]:
    """End-to-end Search over gRPC (query embedding included) on a collection of ``size`` chunks."""
    texts, vecs = corpus[0][:size], corpus[1][:size]
    collection = f"bench-{size}"
    await _drop(client, collection)
    await _ingest(store, model, collection, texts, vecs)
    metadata = [(rc.TENANT, TENANT)]
    start = time.perf_counter()
    while True:  # the first search loads the collection; UNAVAILABLE until it is ready
        try:
            await stub.Search(
                embeddings_pb2.SearchRequest(collection=collection, query=queries[0], top_k=10),
                metadata=metadata,
                timeout=60,
            )
            break
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.perf_counter() - start > 3600:
                raise
    load_s = time.perf_counter() - start
    latencies: list[float] = []
    embed_latencies: list[float] = []
    for text in queries:
        t0 = time.perf_counter()
        await stub.Embed(embeddings_pb2.EmbedRequest(texts=[text]), metadata=metadata)
        embed_latencies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await stub.Search(
            embeddings_pb2.SearchRequest(collection=collection, query=text, top_k=10), metadata=metadata
        )
        latencies.append(time.perf_counter() - t0)
    search = summarize_ms(latencies)
    embed = summarize_ms(embed_latencies)
    rows.append(
        {
            "case": f"service Search, {size} chunks",
            "index": "hnsw" if size > EmbeddingsSettings().hnsw_threshold else "exact",
            "build_s": round(load_s, 1),
            "search_p50_ms": search["p50_ms"],
            "search_p99_ms": search["p99_ms"],
            "embed_query_p50_ms": embed["p50_ms"],
        }
    )
    await _drop(client, collection)
    return {"p99": search["p99_ms"], "p50": search["p50_ms"]}


async def _search(
    stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub,
    model: Any,
    args: argparse.Namespace,
    texts: tuple[Sequence[str], Sequence[str]],
    rows: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[str]]:
    corpus, queries = texts
    sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    headline: dict[str, Any] = {}
    notes: list[str] = []
    static: Vectors | None = None
    info = await _service_model(stub)
    client = redis_client.connect(args.redis_url)
    store = CollectionStore(client)

    def encode(batch: list[str]) -> Vectors:
        out: Vectors = model.encode(
            batch, batch_size=BATCH, normalize_embeddings=True, show_progress_bar=False
        )
        return out

    try:
        for size in sizes:
            if args.vectors == "model" or (
                args.vectors == "auto" and embeddings_corpus.vectors_cached(corpus[:size])
            ):
                corpus_vecs = embeddings_corpus.vectors(corpus[:size], encode)
                query_vecs = embeddings_corpus.vectors(queries, encode)
                kind = "all-MiniLM-L6-v2 vectors"
            else:
                if static is None:
                    static = embeddings_corpus.static_vectors([*corpus, *queries], default_model_path())
                corpus_vecs, query_vecs = static[:size], static[len(corpus) :]
                kind = "static token-embedding vectors (the transformer's are not cached for this size)"
            notes.append(f"{size} chunks: {kind}")
            recall = _recall(size, corpus_vecs, query_vecs, rows)
            result = await _search_case(
                stub,
                size,
                store=store,
                client=client,
                model=info,
                corpus=(corpus, corpus_vecs),
                queries=queries,
                rows=rows,
            )
            label = f"{size // 1000}k"
            headline[f"recall_at_10_{label}"] = round(recall, 4)
            headline[f"search_p99_ms_{label}"] = result["p99"]
            headline[f"search_p50_ms_{label}"] = result["p50"]
    finally:
        await client.aclose()
    return headline, notes


async def _main(args: argparse.Namespace) -> BenchReport:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    largest = max(sizes) if sizes and not args.skip_search else 0
    # The search corpus, then held-out queries, then the throughput sentences.
    all_texts = embeddings_corpus.sentences(largest + args.queries + args.texts)
    search_texts = (all_texts[:largest], all_texts[largest : largest + args.queries])
    throughput_texts = all_texts[largest + args.queries :]
    model = SentenceTransformer(default_model_path(), device="cpu")
    rows: list[dict[str, Any]] = []
    notes = [
        "throughput rounds interleave direct / batch / single; ratios are medians of per-round ratios",
        "the service runs in its own process; its client shares the machine's cores with it",
    ]
    headline: dict[str, Any] = {}
    service = ServiceProcess(args.redis_url)
    channel = await connect(service.address)
    stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
    try:
        headline.update(await _throughput(stub, model, throughput_texts, args.rounds, rows))
        if not args.skip_ingest:
            client = redis_client.connect(args.redis_url)

            async def drop(collection: str) -> None:
                await _drop(client, collection)

            try:
                headline.update(
                    await embeddings_ingest.ingestion(
                        stub,
                        embeddings_address=service.address,
                        redis=args.redis_url,
                        sentences=all_texts,
                        args=args,
                        rows=rows,
                        drop=drop,
                    )
                )
            finally:
                await client.aclose()
            notes.append(
                "ingestion: pages per second through the HTTP API (upload + attach + poll until "
                "completed, a gateway process without policy) vs UpsertDocuments straight to the "
                "service, same documents and concurrency, rounds interleaved; ratio = median per round"
            )
        if not args.skip_search:
            found, more = await _search(stub, model, args, search_texts, rows)
            headline.update(found)
            notes += more
            notes.append(
                "corpus: docstring sentences of the installed Python packages (one chunk each), queries "
                "held out; recall@10 is the service's index (same parameters, built in process) against "
                "exact search; service Search latency is end to end over gRPC, query embedding included"
            )
    finally:
        await channel.close()
        service.stop()
    return BenchReport(name="embeddings", rows=rows, headline=headline, notes=notes)


async def _service_model(stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub) -> ModelInfo:
    response = await stub.Embed(embeddings_pb2.EmbedRequest(texts=["probe"]))
    return ModelInfo(response.model, response.model_revision, response.dimension, 256, 2)


def run(argv: list[str]) -> BenchReport:
    """Entry point of ``llmesh bench embeddings``."""
    args = _parse(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_main(args))
    raise SystemExit(130)
