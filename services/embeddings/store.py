"""The source of truth of every collection, in Redis.

Keys of one (tenant, collection) share the hash tag of the version namespace
``rag:<collection>`` (:func:`services.runtime.versions.slot_tag`), so each write
— chunks, vectors, document table, change log and version bump — is one Lua call
on one slot, atomic on a plain Redis and on a Redis Cluster::

    llmesh:rag:{t:rag:c}:meta    hash  model, revision, dimension, epoch, docs, chunks, trimmed
    llmesh:rag:{t:rag:c}:docs    hash  document id -> {"m": metadata, "n": chunk count}
    llmesh:rag:{t:rag:c}:chunks  hash  "<doc>#<i>" -> {"t": text}
    llmesh:rag:{t:rag:c}:vecs    hash  "<doc>#<i>" -> float32 vector bytes
    llmesh:rag:{t:rag:c}:log     stream, entry id "<version>-0": the documents each write touched
    llmesh:ver:{t:rag:c}         the collection version (services.runtime.versions); permanent
                                 like the rest: the log's entry ids are its versions
    llmesh:rag:collections:{t}   set of the tenant's collection names

Replicas follow a collection through its log: :meth:`CollectionStore.changes`
returns, in one atomic call, the current state of every document touched after
the version a replica holds. A replica too far behind (log trimmed), or one
that saw another incarnation of the collection (``epoch``), rebuilds from a scan.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.embeddings.encoder import ModelInfo, Vectors
from services.embeddings.index import ChunkRecord, chunk_id
from services.runtime import namespaces
from services.runtime.errors import FailedPrecondition, NotFound
from services.runtime.versions import HLC_LUA, slot_tag, version_key

_TRIM = """
local function trim(meta, log, max)
  local len = redis.call('XLEN', log)
  if len > max then
    local old = redis.call('XRANGE', log, '-', '+', 'COUNT', len - max)
    redis.call('XTRIM', log, 'MAXLEN', max)
    redis.call('HSET', meta, 'trimmed', string.match(old[#old][1], '^(%d+)'))
  end
end
local function drop_chunks(id, doc, chunks, vecs)
  local n = cjson.decode(doc)['n']
  for i = 0, n - 1 do
    local cid = id .. '#' .. i
    redis.call('HDEL', chunks, cid)
    redis.call('HDEL', vecs, cid)
  end
  return n
end
"""

# KEYS meta docs chunks vecs log ver; ARGV model revision dimension epoch log_max ndocs,
# then per document: id, doc json, nchunks, then nchunks x (chunk json, vector bytes).
_UPSERT = (
    HLC_LUA
    + _TRIM
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local m = redis.call('HMGET', KEYS[1], 'model', 'dimension', 'revision')
  if m[1] ~= ARGV[1] or m[2] ~= ARGV[3] then return {'model', m[1] or '', m[2] or '', m[3] or ''} end
else
  redis.call('HSET', KEYS[1], 'model', ARGV[1], 'revision', ARGV[2], 'dimension', ARGV[3],
             'epoch', ARGV[4], 'docs', 0, 'chunks', 0, 'trimmed', 0)
end
local pos = 7
local ids = {}
local ddocs, dchunks = 0, 0
for d = 1, tonumber(ARGV[6]) do
  local id, doc, n = ARGV[pos], ARGV[pos + 1], tonumber(ARGV[pos + 2])
  pos = pos + 3
  local old = redis.call('HGET', KEYS[2], id)
  if old then dchunks = dchunks - drop_chunks(id, old, KEYS[3], KEYS[4]) else ddocs = ddocs + 1 end
  redis.call('HSET', KEYS[2], id, doc)
  for i = 0, n - 1 do
    local cid = id .. '#' .. i
    redis.call('HSET', KEYS[3], cid, ARGV[pos])
    redis.call('HSET', KEYS[4], cid, ARGV[pos + 1])
    pos = pos + 2
  end
  dchunks = dchunks + n
  ids[d] = id
end
redis.call('HINCRBY', KEYS[1], 'docs', ddocs)
local total = redis.call('HINCRBY', KEYS[1], 'chunks', dchunks)
local v = hlc_bump(KEYS[6], 0)
redis.call('XADD', KEYS[5], v .. '-0', 'docs', cjson.encode(ids))
trim(KEYS[1], KEYS[5], tonumber(ARGV[5]))
return {'ok', v, total}
"""
)

# KEYS meta docs chunks vecs log ver; ARGV log_max, ids...
_DELETE = (
    HLC_LUA
    + _TRIM
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local ids = {}
local dchunks = 0
for k = 2, #ARGV do
  local id = ARGV[k]
  local old = redis.call('HGET', KEYS[2], id)
  if old then
    dchunks = dchunks + drop_chunks(id, old, KEYS[3], KEYS[4])
    redis.call('HDEL', KEYS[2], id)
    ids[#ids + 1] = id
  end
end
if #ids == 0 then
  local last = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
  if #last > 0 then return {'ok', string.match(last[1][1], '^(%d+)'), 0} end
  return {'ok', hlc_read(KEYS[6], 0), 0}
end
redis.call('HINCRBY', KEYS[1], 'docs', -#ids)
redis.call('HINCRBY', KEYS[1], 'chunks', -dchunks)
local v = hlc_bump(KEYS[6], 0)
redis.call('XADD', KEYS[5], v .. '-0', 'docs', cjson.encode(ids))
trim(KEYS[1], KEYS[5], tonumber(ARGV[1]))
return {'ok', v, #ids}
"""
)

# KEYS meta docs chunks vecs log; ARGV from_version epoch max_docs.
_CHANGES = """
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'trimmed')
if not meta[1] then return {'missing'} end
if meta[1] ~= ARGV[2] or tonumber(meta[2]) > tonumber(ARGV[1]) then return {'rebuild'} end
local entries = redis.call('XRANGE', KEYS[5], '(' .. ARGV[1] .. '-0', '+')
if #entries == 0 then return {'current'} end
local seen, order = {}, {}
for _, entry in ipairs(entries) do
  local fields = entry[2]
  for f = 1, #fields, 2 do
    if fields[f] == 'docs' then
      for _, id in ipairs(cjson.decode(fields[f + 1])) do
        if not seen[id] then seen[id] = true; order[#order + 1] = id end
      end
    end
  end
end
if #order > tonumber(ARGV[3]) then return {'rebuild'} end
local out = {'delta', string.match(entries[#entries][1], '^(%d+)')}
for _, id in ipairs(order) do
  local doc = redis.call('HGET', KEYS[2], id)
  out[#out + 1] = id
  if doc then
    out[#out + 1] = doc
    local n = cjson.decode(doc)['n']
    for i = 0, n - 1 do
      local cid = id .. '#' .. i
      out[#out + 1] = redis.call('HGET', KEYS[3], cid)
      out[#out + 1] = redis.call('HGET', KEYS[4], cid)
    end
  else
    out[#out + 1] = ''
  end
end
return out
"""

MAX_CHANGED_DOCUMENTS = 5_000
_SCAN_BATCH = 500


@dataclass(frozen=True, slots=True)
class CollectionMeta:
    name: str
    model: str
    revision: str
    dimension: int
    epoch: str
    document_count: int
    chunk_count: int
    version: int


@dataclass(slots=True)
class DocumentState:
    """A document as stored: None records = the document is gone."""

    document_id: str
    records: list[ChunkRecord] | None
    vectors: Vectors | None = None


@dataclass(slots=True)
class Changes:
    """What a replica must apply to reach ``version``; ``documents`` empty when already current."""

    kind: str  # "current", "delta", "rebuild", "missing"
    version: int = 0
    documents: list[DocumentState] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WriteResult:
    version: int
    count: int


@dataclass(frozen=True, slots=True)
class PreparedDocument:
    """A document ready to store: its chunks' texts and vectors."""

    document_id: str
    metadata: Mapping[str, str]
    texts: Sequence[str]
    vectors: Vectors


class _Keys:
    def __init__(self, tenant: str, collection: str) -> None:
        prefix = "llmesh:rag:" + slot_tag(tenant, namespaces.rag_collection(collection))
        self.meta = prefix + ":meta"
        self.docs = prefix + ":docs"
        self.chunks = prefix + ":chunks"
        self.vecs = prefix + ":vecs"
        self.log = prefix + ":log"
        self.version = version_key(tenant, namespaces.rag_collection(collection))

    def data(self) -> list[str]:
        return [self.meta, self.docs, self.chunks, self.vecs, self.log]


def collections_key(tenant: str) -> str:
    return "llmesh:rag:collections:{" + tenant + "}"


def _version_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class CollectionStore:
    """Reads and writes collections in Redis (a ``redis.asyncio`` client, bytes responses)."""

    def __init__(self, redis: Any, *, log_max_entries: int = 10_000) -> None:
        self._redis = redis
        self._log_max = log_max_entries
        self._upsert = redis.register_script(_UPSERT)
        self._delete = redis.register_script(_DELETE)
        self._changes = redis.register_script(_CHANGES)

    async def upsert(
        self, tenant: str, collection: str, model: ModelInfo, documents: Sequence[PreparedDocument]
    ) -> WriteResult:
        """Replaces the documents' chunks and bumps the version, atomically; returns the total chunks."""
        keys = _Keys(tenant, collection)
        args: list[Any] = [
            model.name,
            model.revision,
            str(model.dimension),
            uuid.uuid4().hex,
            str(self._log_max),
            str(len(documents)),
        ]
        for doc in documents:
            args += [
                doc.document_id,
                json.dumps({"m": dict(doc.metadata), "n": len(doc.texts)}),
                len(doc.texts),
            ]
            vectors = np.ascontiguousarray(doc.vectors, dtype=np.float32)
            for text, vector in zip(doc.texts, vectors, strict=True):
                args += [json.dumps({"t": text}), vector.tobytes()]
        await self._redis.sadd(collections_key(tenant), collection)
        reply = await self._upsert(keys=[*keys.data(), keys.version], args=args)
        if _text(reply[0]) == "model":
            stored_model, stored_dimension = _text(reply[1]), _text(reply[2])
            raise FailedPrecondition(
                f"collection {collection!r} holds vectors of model {stored_model!r} (dimension "
                f"{stored_dimension}); this service embeds with {model.name!r} "
                f"(dimension {model.dimension}). "
                "Vectors of different models are not comparable: ingest into a new collection."
            )
        return WriteResult(version=int(reply[1]), count=int(reply[2]))

    async def delete(self, tenant: str, collection: str, document_ids: Sequence[str]) -> WriteResult:
        """Removes documents; the version moves only when something was removed."""
        keys = _Keys(tenant, collection)
        reply = await self._delete(
            keys=[*keys.data(), keys.version], args=[str(self._log_max), *document_ids]
        )
        if _text(reply[0]) == "missing":
            raise NotFound(f"collection {collection!r} does not exist")
        return WriteResult(version=int(reply[1]), count=int(reply[2]))

    async def meta(self, tenant: str, collection: str) -> CollectionMeta | None:
        keys = _Keys(tenant, collection)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.xrevrange(keys.log, "+", "-", count=1)
            raw, last = await pipe.execute()
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        return CollectionMeta(
            name=collection,
            model=fields.get("model", ""),
            revision=fields.get("revision", ""),
            dimension=int(fields.get("dimension", "0")),
            epoch=fields.get("epoch", ""),
            document_count=int(fields.get("docs", "0")),
            chunk_count=int(fields.get("chunks", "0")),
            version=_version_of(last[0][0]) if last else 0,
        )

    async def list(self, tenant: str) -> list[CollectionMeta]:
        names = sorted(_text(n) for n in await self._redis.smembers(collections_key(tenant)))
        out = []
        for name in names:
            meta = await self.meta(tenant, name)
            if meta is not None:
                out.append(meta)
        return out

    async def changes(self, tenant: str, collection: str, since: int, epoch: str) -> Changes:
        """Documents touched after version ``since`` of incarnation ``epoch``, as they are now."""
        keys = _Keys(tenant, collection)
        reply = await self._changes(keys=keys.data(), args=[str(since), epoch, str(MAX_CHANGED_DOCUMENTS)])
        kind = _text(reply[0])
        if kind != "delta":
            return Changes(kind)
        documents: list[DocumentState] = []
        pos = 2
        while pos < len(reply):
            document_id, doc = _text(reply[pos]), reply[pos + 1]
            pos += 2
            if not doc:
                documents.append(DocumentState(document_id, None))
                continue
            info = json.loads(doc)
            n = int(info["n"])
            texts = [json.loads(reply[pos + 2 * i])["t"] for i in range(n)]
            vectors = [reply[pos + 2 * i + 1] for i in range(n)]
            pos += 2 * n
            documents.append(_document(document_id, info["m"], texts, vectors))
        return Changes("delta", version=int(reply[1]), documents=documents)

    async def snapshot(
        self, tenant: str, collection: str
    ) -> tuple[CollectionMeta | None, AsyncIterator[DocumentState]]:
        """The collection's meta (version = the log head when the scan starts) and a scan of its
        documents. Documents written during the scan may be newer than that version; applying
        :meth:`changes` since it afterwards makes the replica exact."""
        meta = await self.meta(tenant, collection)
        return meta, self._scan(_Keys(tenant, collection))

    async def _scan(self, keys: _Keys) -> AsyncIterator[DocumentState]:
        cursor = 0
        while True:
            cursor, batch = await self._redis.hscan(keys.docs, cursor, count=_SCAN_BATCH)
            items = [(_text(k), json.loads(v)) for k, v in batch.items()]
            ids = [chunk_id(doc_id, i) for doc_id, info in items for i in range(int(info["n"]))]
            texts_raw: list[bytes | None] = []
            vecs_raw: list[bytes | None] = []
            if ids:
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.hmget(keys.chunks, ids)
                    pipe.hmget(keys.vecs, ids)
                    texts_raw, vecs_raw = await pipe.execute()
            pos = 0
            for doc_id, info in items:
                n = int(info["n"])
                texts, vectors = texts_raw[pos : pos + n], vecs_raw[pos : pos + n]
                pos += n
                present_texts = [t for t in texts if t is not None]
                present_vectors = [v for v in vectors if v is not None]
                if len(present_texts) < n or len(present_vectors) < n:
                    continue  # rewritten during the scan: the changes after the snapshot bring it
                yield _document(
                    doc_id, info["m"], [json.loads(t)["t"] for t in present_texts], present_vectors
                )
            if cursor == 0:
                return


def _document(
    document_id: str, metadata: Mapping[str, str], texts: list[str], vectors: list[bytes]
) -> DocumentState:
    meta = dict(metadata)
    records = [ChunkRecord(document_id, i, text, meta) for i, text in enumerate(texts)]
    matrix = (
        np.frombuffer(b"".join(vectors), dtype=np.float32).reshape(len(vectors), -1)
        if vectors
        else np.zeros((0, 0), dtype=np.float32)
    )
    return DocumentState(document_id, records, matrix)
