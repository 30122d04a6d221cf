"""Vector stores and their attached files, per tenant, in Redis.

Layout (hash tag ``{<tenant>}``: each script runs on one slot)::

    llmesh:vs:{t}:index            sorted set (lexicographic): the tenant's store ids
    llmesh:vs:{t}:store:<vs>       hash: name, created_at, last_active_at, metadata (JSON),
                                   usage_bytes, and the file counts total, in_progress,
                                   completed, failed, cancelled
    llmesh:vs:{t}:files:<vs>       sorted set (lexicographic) of "<attach ms, hex>:<file id>"
    llmesh:vs:{t}:file:<vs>:<id>   hash: order, created_at, status, job, lease (ms, Redis
                                   clock), parts, usage_bytes, error_code, error_message,
                                   attributes (JSON), chunking (JSON)
    llmesh:vs:{t}:pending          sorted set "<vs> <file id>" -> lease deadline (ms)

Every status change is one Lua call that moves the store's counts with it, so
``file_counts`` is always the sum of its files' statuses. An ingestion job owns its file
while its ``job`` id is the one recorded and its lease has not run out; its gateway renews
the lease (:meth:`StoreRepo.heartbeat`). A job whose lease ran out is failed by whichever
gateway next reads the tenant's stores (:meth:`StoreRepo.expired`), which then deletes what
the job wrote. Bounds: ``vector_stores_tenant_max`` stores per tenant,
``vector_stores_max_files`` files per store; nothing else is kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.vector_stores.documents import Attribute
from gateway.vector_stores.pages import PageQuery, lex_page, new_id, redis_errors
from services.runtime.errors import InvalidArgument, NotFound, ResourceExhausted

STORE_PREFIX = "vs_"
_ID_LENGTH = len(STORE_PREFIX) + 28
WHAT = "the vector store registry"
FileStatus = Literal["in_progress", "completed", "cancelled", "failed"]
STATUSES: tuple[FileStatus, ...] = ("in_progress", "completed", "cancelled", "failed")

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS index store; ARGV id max name created metadata.
_CREATE = """
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], 'id', ARGV[1], 'name', ARGV[3], 'created_at', ARGV[4],
           'last_active_at', ARGV[4], 'metadata', ARGV[5], 'usage_bytes', 0, 'total', 0,
           'in_progress', 0, 'completed', 0, 'failed', 0, 'cancelled', 0)
redis.call('ZADD', KEYS[1], 0, ARGV[1])
return 1
"""

# KEYS store; ARGV field value pairs.
_UPDATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""

# KEYS store files file pending; ARGV file_id order created job lease_ms max_files attributes
# chunking pending_member.
_ATTACH = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'nostore' end
local lease = now + tonumber(ARGV[5])
local status = redis.call('HGET', KEYS[3], 'status')
if status then
  if status ~= 'failed' and status ~= 'cancelled' then return 'exists' end
  redis.call('HINCRBY', KEYS[1], status, -1)
  redis.call('HINCRBY', KEYS[1], 'in_progress', 1)
  redis.call('HSET', KEYS[3], 'status', 'in_progress', 'job', ARGV[4], 'lease', lease, 'parts', 0,
             'usage_bytes', 0, 'error_code', '', 'error_message', '', 'attributes', ARGV[7],
             'chunking', ARGV[8])
  redis.call('ZADD', KEYS[4], lease, ARGV[9])
  return 'restarted'
end
if tonumber(redis.call('HGET', KEYS[1], 'total')) >= tonumber(ARGV[6]) then return 'limit' end
redis.call('HSET', KEYS[3], 'id', ARGV[1], 'order', ARGV[2], 'created_at', ARGV[3],
           'status', 'in_progress', 'job', ARGV[4], 'lease', lease, 'parts', 0, 'usage_bytes', 0,
           'error_code', '', 'error_message', '', 'attributes', ARGV[7], 'chunking', ARGV[8])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
redis.call('HINCRBY', KEYS[1], 'total', 1)
redis.call('HINCRBY', KEYS[1], 'in_progress', 1)
redis.call('ZADD', KEYS[4], lease, ARGV[9])
return 'created'
"""
)

# KEYS file pending; ARGV job lease_ms pending_member, [parts].
_HEARTBEAT = (
    _NOW
    + """
local h = redis.call('HMGET', KEYS[1], 'job', 'status')
if h[1] ~= ARGV[1] or h[2] ~= 'in_progress' then return 0 end
local lease = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease', lease)
if ARGV[4] then redis.call('HSET', KEYS[1], 'parts', ARGV[4]) end
redis.call('ZADD', KEYS[2], lease, ARGV[3])
return 1
"""
)

# KEYS store file pending; ARGV job status error_code error_message usage_bytes pending_member.
_FINISH = """
local h = redis.call('HMGET', KEYS[2], 'job', 'status')
if h[1] ~= ARGV[1] or h[2] ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[2], 'status', ARGV[2], 'error_code', ARGV[3], 'error_message', ARGV[4],
           'usage_bytes', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'in_progress', -1)
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
if ARGV[2] == 'completed' then redis.call('HINCRBY', KEYS[1], 'usage_bytes', tonumber(ARGV[5])) end
redis.call('ZREM', KEYS[3], ARGV[6])
return 1
"""

# KEYS pending; ARGV max. Members whose lease ran out by Redis' clock.
_OVERDUE = (
    _NOW
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
"""
)

# KEYS store file pending; ARGV pending_member message. {1, job, parts} when failed here.
_EXPIRE = (
    _NOW
    + """
local h = redis.call('HMGET', KEYS[2], 'status', 'lease', 'job', 'parts')
if h[1] ~= 'in_progress' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return {0}
end
local lease = tonumber(h[2])
if lease > now then
  redis.call('ZADD', KEYS[3], lease, ARGV[1])
  return {0}
end
redis.call('HSET', KEYS[2], 'status', 'failed', 'error_code', 'server_error', 'error_message', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'in_progress', -1)
redis.call('HINCRBY', KEYS[1], 'failed', 1)
redis.call('ZREM', KEYS[3], ARGV[1])
return {1, h[3], h[4]}
"""
)

# KEYS store files file pending; ARGV pending_member. {1, job, parts} when detached.
_DETACH = """
local h = redis.call('HMGET', KEYS[3], 'status', 'usage_bytes', 'job', 'parts', 'order')
if not h[1] then return {0} end
redis.call('HINCRBY', KEYS[1], 'total', -1)
redis.call('HINCRBY', KEYS[1], h[1], -1)
if h[1] == 'completed' then redis.call('HINCRBY', KEYS[1], 'usage_bytes', -tonumber(h[2])) end
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[2], h[5])
redis.call('ZREM', KEYS[4], ARGV[1])
return {1, h[3], h[4]}
"""

# KEYS index store files pending file...; ARGV id file_id... ; {'retry'} when files changed.
_DELETE = """
if redis.call('EXISTS', KEYS[2]) == 0 then return {'missing'} end
if redis.call('ZCARD', KEYS[3]) ~= #ARGV - 1 then return {'retry'} end
local out = {'ok'}
for i = 2, #ARGV do
  local h = redis.call('HMGET', KEYS[i + 3], 'job', 'parts')
  if not h[1] then return {'retry'} end
  out[#out + 1] = ARGV[i]
  out[#out + 1] = h[1]
  out[#out + 1] = h[2]
end
for i = 2, #ARGV do
  redis.call('DEL', KEYS[i + 3])
  redis.call('ZREM', KEYS[4], ARGV[1] .. ' ' .. ARGV[i])
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[1], ARGV[1])
return out
"""


def valid_store_id(store_id: str) -> bool:
    rest = store_id[len(STORE_PREFIX) :]
    return (
        store_id.startswith(STORE_PREFIX)
        and len(store_id) == _ID_LENGTH
        and all(c in "0123456789abcdef" for c in rest)
    )


def _text(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


@dataclass(frozen=True, slots=True)
class StoreRecord:
    id: str
    name: str
    created_at: int
    last_active_at: int
    metadata: dict[str, str]
    usage_bytes: int
    counts: dict[str, int]

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> StoreRecord:
        h = _text(raw)
        counts = {name: int(h.get(name, "0")) for name in (*STATUSES, "total")}
        return cls(
            id=h["id"],
            name=h["name"],
            created_at=int(h["created_at"]),
            last_active_at=int(h["last_active_at"]),
            metadata=json.loads(h.get("metadata") or "{}"),
            usage_bytes=int(h.get("usage_bytes", "0")),
            counts=counts,
        )


@dataclass(frozen=True, slots=True)
class Refs:
    """What one ingestion attempt wrote (or may have): its job id and part count."""

    file_id: str
    job: str
    parts: int


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    store_id: str
    created_at: int
    status: FileStatus
    job: str
    parts: int
    usage_bytes: int
    error_code: str
    error_message: str
    attributes: dict[str, Attribute] = field(default_factory=dict)
    chunking: dict[str, int] | None = None

    @classmethod
    def from_hash(cls, store_id: str, raw: dict[bytes, bytes]) -> FileRecord:
        h = _text(raw)
        status = h["status"]
        assert status in STATUSES
        return cls(
            id=h["id"],
            store_id=store_id,
            created_at=int(h["created_at"]),
            status=status,  # type: ignore[arg-type]
            job=h["job"],
            parts=int(h.get("parts", "0")),
            usage_bytes=int(h.get("usage_bytes", "0")),
            error_code=h.get("error_code", ""),
            error_message=h.get("error_message", ""),
            attributes=json.loads(h.get("attributes") or "{}"),
            chunking=json.loads(h.get("chunking") or "null"),
        )


class StoreRepo:
    """The tenant-scoped vector store registry (see the module docstring)."""

    def __init__(self, redis: Any, *, max_stores: int, max_files: int, lease_s: float) -> None:
        self._redis = redis
        self._max_stores = max_stores
        self._max_files = max_files
        self.lease_ms = max(1, int(lease_s * 1000))
        self._scripts: dict[str, Any] = {
            name: redis.register_script(body)
            for name, body in (
                ("create", _CREATE),
                ("update", _UPDATE),
                ("attach", _ATTACH),
                ("heartbeat", _HEARTBEAT),
                ("finish", _FINISH),
                ("overdue", _OVERDUE),
                ("expire", _EXPIRE),
                ("detach", _DETACH),
                ("delete", _DELETE),
            )
        }

    # -- keys ---------------------------------------------------------------------------------

    @staticmethod
    def _base(tenant: str) -> str:
        return f"llmesh:vs:{{{tenant}}}:"

    def _store_key(self, tenant: str, store_id: str) -> str:
        return f"{self._base(tenant)}store:{store_id}"

    def _files_key(self, tenant: str, store_id: str) -> str:
        return f"{self._base(tenant)}files:{store_id}"

    def _file_key(self, tenant: str, store_id: str, file_id: str) -> str:
        return f"{self._base(tenant)}file:{store_id}:{file_id}"

    def _pending_key(self, tenant: str) -> str:
        return self._base(tenant) + "pending"

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        async with redis_errors(WHAT):
            return await self._scripts[name](keys=list(keys), args=list(args))

    # -- stores -------------------------------------------------------------------------------

    async def create(self, tenant: str, name: str, metadata: dict[str, str]) -> StoreRecord:
        store_id = new_id(STORE_PREFIX)
        now = int(time.time())
        created = await self._run(
            "create",
            [self._base(tenant) + "index", self._store_key(tenant, store_id)],
            [store_id, self._max_stores, name, now, json.dumps(metadata)],
        )
        if not int(created):
            raise ResourceExhausted(
                f"the tenant already keeps {self._max_stores} vector stores, the limit; delete one first"
            )
        counts = dict.fromkeys((*STATUSES, "total"), 0)
        return StoreRecord(store_id, name, now, now, metadata, 0, counts)

    async def get(self, tenant: str, store_id: str) -> StoreRecord:
        found = await self.find(tenant, [store_id])
        if found[0] is None:
            raise NotFound(f"no such vector store: {store_id!r}")
        return found[0]

    async def find(self, tenant: str, store_ids: Sequence[str]) -> list[StoreRecord | None]:
        out: list[StoreRecord | None] = [None] * len(store_ids)
        wanted = [(i, s) for i, s in enumerate(store_ids) if valid_store_id(s)]
        if not wanted:
            return out
        async with redis_errors(WHAT), self._redis.pipeline(transaction=False) as pipe:
            for _, store_id in wanted:
                pipe.hgetall(self._store_key(tenant, store_id))
            rows = await pipe.execute()
        for (i, _), raw in zip(wanted, rows, strict=True):
            if raw:
                out[i] = StoreRecord.from_hash(raw)
        return out

    async def page(self, tenant: str, query: PageQuery) -> tuple[list[StoreRecord], bool]:
        async def load(ids: Sequence[str]) -> list[StoreRecord | None]:
            return await self.find(tenant, ids)

        async with redis_errors(WHAT):
            return await lex_page(self._redis, self._base(tenant) + "index", query, load)

    async def update(self, tenant: str, store_id: str, fields: dict[str, str]) -> None:
        """Sets fields of an existing store (name, metadata, last_active_at); NotFound otherwise."""
        if not valid_store_id(store_id):
            raise NotFound(f"no such vector store: {store_id!r}")
        pairs = [x for item in fields.items() for x in item]
        if not int(await self._run("update", [self._store_key(tenant, store_id)], pairs)):
            raise NotFound(f"no such vector store: {store_id!r}")

    async def delete_refs(self, tenant: str, store_id: str) -> list[Refs]:
        """What the store's files wrote, read without changing anything."""
        files = await self._file_ids(tenant, store_id)
        records = await self._file_records(tenant, store_id, files)
        return [Refs(r.id, r.job, r.parts) for r in records if r is not None]

    async def delete(self, tenant: str, store_id: str) -> list[Refs] | None:
        """Removes the store and its files' records at once; what they wrote (to delete from
        the collection), or None when the store does not exist."""
        if not valid_store_id(store_id):
            return None
        base = self._base(tenant)
        for _ in range(10):
            files = await self._file_ids(tenant, store_id)
            keys = [
                base + "index",
                self._store_key(tenant, store_id),
                self._files_key(tenant, store_id),
                self._pending_key(tenant),
                *(self._file_key(tenant, store_id, f) for f in files),
            ]
            reply = await self._run("delete", keys, [store_id, *files])
            status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            if status == "missing":
                return None
            if status == "ok":
                rest = [x.decode() if isinstance(x, bytes) else str(x) for x in reply[1:]]
                return [Refs(rest[i], rest[i + 1], int(rest[i + 2] or 0)) for i in range(0, len(rest), 3)]
        raise ResourceExhausted("the vector store's files keep changing; retry the delete", retry_after_s=1.0)

    # -- attached files -----------------------------------------------------------------------

    def _member(self, store_id: str, file_id: str) -> str:
        return f"{store_id} {file_id}"

    async def attach(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        *,
        job: str,
        attributes: dict[str, Attribute],
        chunking: dict[str, int] | None,
    ) -> str:
        """Records a file as in_progress for ``job``: "created", "restarted" (it had failed),
        or "exists" (attached already, left as it is)."""
        now_ms = int(time.time() * 1000)
        result = await self._run(
            "attach",
            [
                self._store_key(tenant, store_id),
                self._files_key(tenant, store_id),
                self._file_key(tenant, store_id, file_id),
                self._pending_key(tenant),
            ],
            [
                file_id,
                f"{now_ms:012x}:{file_id}",
                now_ms // 1000,
                job,
                self.lease_ms,
                self._max_files,
                json.dumps(attributes),
                json.dumps(chunking),
                self._member(store_id, file_id),
            ],
        )
        outcome = result.decode() if isinstance(result, bytes) else str(result)
        if outcome == "nostore":
            raise NotFound(f"no such vector store: {store_id!r}")
        if outcome == "limit":
            raise ResourceExhausted(
                f"the vector store already has {self._max_files} files, the limit; detach some first"
            )
        return outcome

    async def get_file(self, tenant: str, store_id: str, file_id: str) -> FileRecord:
        found = await self._file_records(tenant, store_id, [file_id])
        if found[0] is None:
            raise NotFound(f"no such file in vector store {store_id!r}: {file_id!r}")
        return found[0]

    async def _file_records(
        self, tenant: str, store_id: str, file_ids: Sequence[str]
    ) -> list[FileRecord | None]:
        if not file_ids or not valid_store_id(store_id):
            return [None] * len(file_ids)
        async with redis_errors(WHAT), self._redis.pipeline(transaction=False) as pipe:
            for file_id in file_ids:
                pipe.hgetall(self._file_key(tenant, store_id, file_id))
            rows = await pipe.execute()
        return [FileRecord.from_hash(store_id, raw) if raw else None for raw in rows]

    async def _file_ids(self, tenant: str, store_id: str) -> list[str]:
        async with redis_errors(WHAT):
            members = await self._redis.zrange(self._files_key(tenant, store_id), 0, -1)
        return [m.decode().split(":", 1)[1] for m in members]

    async def list_files(
        self, tenant: str, store_id: str, query: PageQuery, status: FileStatus | None = None
    ) -> tuple[list[FileRecord], bool]:
        cursor = query.after if query.after is not None else query.before
        if cursor is not None:
            async with redis_errors(WHAT):
                order = await self._redis.hget(self._file_key(tenant, store_id, cursor), "order")
            if order is None:
                which = "after" if query.after is not None else "before"
                raise InvalidArgument(f"{which}: {cursor!r} is not a file of this vector store")
            position = order.decode()
            query = PageQuery(
                query.limit,
                query.order,
                position if query.after is not None else None,
                position if query.before is not None else None,
            )

        async def load(members: Sequence[str]) -> list[FileRecord | None]:
            rows = await self._file_records(tenant, store_id, [m.split(":", 1)[1] for m in members])
            return [r if r is not None and (status is None or r.status == status) else None for r in rows]

        async with redis_errors(WHAT):
            return await lex_page(self._redis, self._files_key(tenant, store_id), query, load)

    async def detach(self, tenant: str, store_id: str, file_id: str) -> Refs | None:
        """Removes an attached file's record; what its last attempt wrote, None if not attached."""
        reply = await self._run(
            "detach",
            [
                self._store_key(tenant, store_id),
                self._files_key(tenant, store_id),
                self._file_key(tenant, store_id, file_id),
                self._pending_key(tenant),
            ],
            [self._member(store_id, file_id)],
        )
        if not int(reply[0]):
            return None
        return Refs(file_id, reply[1].decode(), int(reply[2] or 0))

    # -- jobs ---------------------------------------------------------------------------------

    async def heartbeat(
        self, tenant: str, store_id: str, file_id: str, job: str, parts: int | None = None
    ) -> bool:
        """Renews the job's lease (and records its part count); False when the job no longer
        owns the file (detached, store deleted, failed as interrupted, attached again)."""
        args: list[Any] = [job, self.lease_ms, self._member(store_id, file_id)]
        if parts is not None:
            args.append(parts)
        keys = [self._file_key(tenant, store_id, file_id), self._pending_key(tenant)]
        return bool(int(await self._run("heartbeat", keys, args)))

    async def finish(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        job: str,
        status: FileStatus,
        *,
        usage_bytes: int = 0,
        error: tuple[str, str] = ("", ""),
    ) -> bool:
        """Sets the job's outcome; False when the job no longer owns the file."""
        keys = [
            self._store_key(tenant, store_id),
            self._file_key(tenant, store_id, file_id),
            self._pending_key(tenant),
        ]
        args = [job, status, error[0], error[1], usage_bytes, self._member(store_id, file_id)]
        return bool(int(await self._run("finish", keys, args)))

    async def expired(self, tenant: str, message: str, limit: int = 50) -> list[tuple[str, Refs]]:
        """Fails the tenant's jobs whose lease ran out; (store id, what each wrote)."""
        pending = self._pending_key(tenant)
        members = await self._run("overdue", [pending], [limit])
        out: list[tuple[str, Refs]] = []
        for raw in members:
            store_id, _, file_id = raw.decode().partition(" ")
            reply = await self._run(
                "expire",
                [
                    self._store_key(tenant, store_id),
                    self._file_key(tenant, store_id, file_id),
                    pending,
                ],
                [raw.decode(), message],
            )
            if int(reply[0]):
                out.append((store_id, Refs(file_id, reply[1].decode(), int(reply[2] or 0))))
        return out
