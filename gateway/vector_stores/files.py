"""Uploaded files, per tenant, in Redis, under a quota.

Layout (every key of a tenant shares the hash tag ``{<tenant>}``, so each script runs on
one slot of a Redis Cluster)::

    llmesh:files:{t}:index       sorted set (lexicographic): the tenant's file ids
    llmesh:files:{t}:meta:<id>   hash: filename, purpose, size, created_at, kind, stored, chars, pages
    llmesh:files:{t}:data:<id>   the file's bytes
    llmesh:files:{t}:text:<id>   the text extracted from a PDF or HTML file (UTF-8); none for
                                 plain text and Markdown, whose text is their bytes
    llmesh:files:{t}:usage       hash: bytes (data + extracted text of every file), files

Writes are one Lua call each: an upload is refused (nothing written) when it would take the
tenant past ``files_tenant_quota_bytes`` or ``files_tenant_max_files``, and a delete gives the
bytes back, so every key is bounded by the quota. Why Redis and not the embeddings service:
the original bytes must come back unchanged (``GET /v1/files/{id}/content``) and be ingested
again into any other store, while the embeddings service keeps chunks and vectors only; Redis
is already the gateway's store (rate limits), so no new service or RPC is needed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.vector_stores.extract import Kind, decode_text
from gateway.vector_stores.pages import PageQuery, lex_page, new_id, redis_errors
from services.runtime.errors import NotFound, ResourceExhausted

FILE_PREFIX = "file-"
_ID_LENGTH = len(FILE_PREFIX) + 28
WHAT = "the file store"

# KEYS index meta data text usage; ARGV id quota max_files stored data text, then meta pairs.
_CREATE = """
local used = tonumber(redis.call('HGET', KEYS[5], 'bytes') or '0')
local count = tonumber(redis.call('HGET', KEYS[5], 'files') or '0')
local stored = tonumber(ARGV[4])
if count + 1 > tonumber(ARGV[3]) then return {'files', count} end
if used + stored > tonumber(ARGV[2]) then return {'bytes', used} end
redis.call('SET', KEYS[3], ARGV[5])
if ARGV[6] ~= '' then redis.call('SET', KEYS[4], ARGV[6]) end
local fields = {}
for i = 7, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('ZADD', KEYS[1], 0, ARGV[1])
redis.call('HINCRBY', KEYS[5], 'bytes', stored)
redis.call('HINCRBY', KEYS[5], 'files', 1)
return {'ok', 0}
"""

# KEYS index meta data text usage; ARGV id.
_DELETE = """
local stored = redis.call('HGET', KEYS[2], 'stored')
if not stored then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[5], 'bytes', -tonumber(stored))
redis.call('HINCRBY', KEYS[5], 'files', -1)
return 1
"""


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One file's metadata."""

    id: str
    filename: str
    purpose: str
    size: int
    created_at: int
    kind: Kind
    chars: int
    pages: int

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> StoredFile:
        h = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(
            id=h["id"],
            filename=h["filename"],
            purpose=h["purpose"],
            size=int(h["size"]),
            created_at=int(h["created_at"]),
            kind=Kind(h["kind"]),
            chars=int(h.get("chars", "0")),
            pages=int(h.get("pages", "0")),
        )


def valid_file_id(file_id: str) -> bool:
    """Whether ``file_id`` has the shape of an id made here (anything else is simply not found)."""
    rest = file_id[len(FILE_PREFIX) :]
    return (
        file_id.startswith(FILE_PREFIX)
        and len(file_id) == _ID_LENGTH
        and all(c in "0123456789abcdef" for c in rest)
    )


class FileStore:
    """The tenant-scoped file store (see the module docstring)."""

    def __init__(self, redis: Any, *, quota_bytes: int, max_files: int) -> None:
        self._redis = redis
        self._quota = quota_bytes
        self._max_files = max_files
        self._create: Any = redis.register_script(_CREATE)
        self._delete: Any = redis.register_script(_DELETE)

    @staticmethod
    def _keys(tenant: str, file_id: str) -> list[str]:
        base = f"llmesh:files:{{{tenant}}}:"
        return [
            base + "index",
            f"{base}meta:{file_id}",
            f"{base}data:{file_id}",
            f"{base}text:{file_id}",
            base + "usage",
        ]

    async def create(
        self,
        tenant: str,
        *,
        filename: str,
        purpose: str,
        data: bytes,
        kind: Kind,
        text: str,
        pages: int = 0,
    ) -> StoredFile:
        """Stores a file and its extracted text; ResourceExhausted (429) past the tenant's quota."""
        file_id = new_id(FILE_PREFIX)
        # Plain text and Markdown are read back from their bytes: no second copy.
        extracted = b"" if kind in (Kind.TEXT, Kind.MARKDOWN) else text.encode()
        stored = len(data) + len(extracted)
        meta = StoredFile(file_id, filename, purpose, len(data), int(time.time()), kind, len(text), pages)
        pairs: list[str | int] = []
        for item in dataclasses.fields(meta):
            pairs += [item.name, str(getattr(meta, item.name))]
        pairs += ["stored", stored]
        async with redis_errors(WHAT):
            status, used = await self._create(
                keys=self._keys(tenant, file_id),
                args=[file_id, self._quota, self._max_files, stored, data, extracted, *pairs],
            )
        status = status.decode() if isinstance(status, bytes) else status
        if status == "files":
            raise ResourceExhausted(
                f"file: the tenant already keeps {int(used)} files, the limit; delete some first"
            )
        if status == "bytes":
            raise ResourceExhausted(
                f"file: storing it ({stored} bytes with its extracted text) would take the tenant's "
                f"files past their quota of {self._quota} bytes ({int(used)} used); delete some first"
            )
        return meta

    async def get(self, tenant: str, file_id: str) -> StoredFile:
        """The file's metadata; NotFound for an unknown id or another tenant's file."""
        found = await self.find(tenant, [file_id])
        if found[0] is None:
            raise NotFound(f"no such file: {file_id!r}")
        return found[0]

    async def find(self, tenant: str, file_ids: Sequence[str]) -> list[StoredFile | None]:
        """Metadata of each id (None where there is none)."""
        out: list[StoredFile | None] = [None] * len(file_ids)
        wanted = [(i, f) for i, f in enumerate(file_ids) if valid_file_id(f)]
        if not wanted:
            return out
        async with redis_errors(WHAT), self._redis.pipeline(transaction=False) as pipe:
            for _, file_id in wanted:
                pipe.hgetall(self._keys(tenant, file_id)[1])
            rows = await pipe.execute()
        for (i, _), raw in zip(wanted, rows, strict=True):
            if raw:
                out[i] = StoredFile.from_hash(raw)
        return out

    async def content(self, tenant: str, file_id: str) -> tuple[StoredFile, bytes]:
        meta = await self.get(tenant, file_id)
        async with redis_errors(WHAT):
            data = await self._redis.get(self._keys(tenant, file_id)[2])
        if data is None:
            raise NotFound(f"no such file: {file_id!r}")
        return meta, bytes(data)

    async def text(self, tenant: str, file_id: str) -> tuple[StoredFile, str] | None:
        """The file's text (extracted at upload), or None when the file is gone."""
        found = await self.find(tenant, [file_id])
        meta = found[0]
        if meta is None:
            return None
        keys = self._keys(tenant, file_id)
        plain = meta.kind in (Kind.TEXT, Kind.MARKDOWN)
        async with redis_errors(WHAT):
            raw = await self._redis.get(keys[2] if plain else keys[3])
        if raw is None:
            return None
        return meta, decode_text(bytes(raw)) if plain else bytes(raw).decode()

    async def page(
        self, tenant: str, query: PageQuery, purpose: str | None = None
    ) -> tuple[list[StoredFile], bool]:
        async def load(ids: Sequence[str]) -> list[StoredFile | None]:
            rows = await self.find(tenant, ids)
            return [r if r is not None and (purpose is None or r.purpose == purpose) else None for r in rows]

        async with redis_errors(WHAT):
            return await lex_page(self._redis, self._keys(tenant, "")[0], query, load)

    async def delete(self, tenant: str, file_id: str) -> None:
        """Deletes the file; NotFound when there is none."""
        if not valid_file_id(file_id):
            raise NotFound(f"no such file: {file_id!r}")
        async with redis_errors(WHAT):
            deleted = await self._delete(keys=self._keys(tenant, file_id), args=[file_id])
        if not int(deleted):
            raise NotFound(f"no such file: {file_id!r}")
