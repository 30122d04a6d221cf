"""The audit log: every decision appended to a Redis Stream as a hash chain.

Each policy process is one *chain* (a random id at start). A record carries its
chain, its sequence number in the chain, the hash of the previous record of the
chain, the id of the HMAC key (``kid``) and its own hash,
``HMAC-SHA256(key, canonical JSON of the record)`` with a key kept out of Redis
(:mod:`policy.audit_key`): rewriting a record and recomputing the chain after it
needs that key, not only write access to Redis. The chain is
computed in memory when the decision is made, so a decision costs no Redis round
trip; a background task writes batches with one Lua call that appends the
records and moves the chain's head (``<key>:heads``: ``seq:hash``) atomically and
idempotently (a batch retried after a lost reply is not written twice).

When Redis is down, records wait in memory up to ``buffer_limit``; past that,
:meth:`AuditLog.append` raises ``Unavailable`` so that a decision is never made
without its record. ``llmesh audit verify`` walks the stream and reports any
altered record (hash mismatch), removed record (a gap in a chain, a broken
``prev`` link, a head ahead of the last record) or duplicated one (see
:mod:`policy.audit_check`); ``llmesh audit trim`` drops old records and leaves a
checkpoint per chain so that what remains can still be verified.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Protocol

from policy import metrics
from policy.audit_key import key_id, mac, verifier_keys
from services.runtime.errors import FailedPrecondition, Unavailable
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

DEFAULT_KEY = "llmesh:audit:{audit}"
GENESIS = "0" * 64
# 1: plain SHA-256 links (rewritable by anyone who can write Redis); 2: HMAC-SHA256 links.
FORMAT_VERSION = 2

# KEYS[1] stream, KEYS[2] heads; ARGV: chain, then (seq, hash, record) triples.
_APPEND = """
local head = redis.call('HGET', KEYS[2], ARGV[1])
local last = 0
if head then last = tonumber(string.match(head, '^(%d+):')) end
local newest = nil
for i = 2, #ARGV, 3 do
  local seq = tonumber(ARGV[i])
  if seq > last then
    redis.call('XADD', KEYS[1], '*', 'chain', ARGV[1], 'seq', ARGV[i],
      'hash', ARGV[i + 1], 'record', ARGV[i + 2])
    last = seq
    newest = ARGV[i] .. ':' .. ARGV[i + 1]
  end
end
if newest then redis.call('HSET', KEYS[2], ARGV[1], newest) end
return last
"""


def stream_key(base: str) -> str:
    return f"{base}:records"


def heads_key(base: str) -> str:
    return f"{base}:heads"


def checkpoints_key(base: str) -> str:
    """Per chain, ``seq:hash`` of the last record removed by a trim (where verification starts)."""
    return f"{base}:checkpoints"


@dataclass(frozen=True)
class AuditRecord:
    """One decision, as the audit log keeps it (never the text unless the tenant asks)."""

    request_id: str
    tenant: str
    ruleset_version: str
    rule_ids: tuple[str, ...]
    action: str
    kind: str  # input | output | stream
    text_sha256: str
    response_sha256: str = ""
    text: str | None = None
    ts_ms: int = field(default_factory=lambda: int(time.time() * 1000))


_RECORD_FIELDS = tuple(f.name for f in dataclass_fields(AuditRecord))


def canonical(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def record_hash(record_json: str) -> str:
    """Plain SHA-256 of a record: the link of format 1, and the digest of texts in records."""
    return hashlib.sha256(record_json.encode("utf-8")).hexdigest()


class AuditSink(Protocol):
    """Where the service sends decisions (a fake in unit tests)."""

    def append(self, record: AuditRecord) -> None: ...

    @property
    def accepting(self) -> bool: ...


@dataclass(frozen=True)
class _Entry:
    seq: int
    hash: str
    record: str


class AuditLog:
    """Hash-chained, buffered writer to a Redis Stream (see module doc)."""

    def __init__(
        self,
        redis: Any,
        *,
        hmac_key: bytes,
        key: str = DEFAULT_KEY,
        buffer_limit: int = 10_000,
        batch_size: int = 256,
        retry_max_s: float = 5.0,
        on_accepting_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._redis = redis
        self._script = redis.register_script(_APPEND)
        self.key = key
        self._hmac_key = hmac_key
        self.key_id = key_id(hmac_key)
        self.chain = uuid.uuid4().hex[:16]
        self.buffer_limit = buffer_limit
        self.batch_size = batch_size
        self.retry_max_s = retry_max_s
        self.on_accepting_change = on_accepting_change
        self._queue: collections.deque[_Entry] = collections.deque()
        self._seq = 0
        self._prev = GENESIS
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = True
        self.redis_ok = True
        self.written = 0

    @property
    def accepting(self) -> bool:
        """False once the buffer is full (Redis down too long): decisions then fail UNAVAILABLE."""
        return self._accepting

    @property
    def buffered(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="audit-flush")

    def append(self, record: AuditRecord) -> None:
        """Chains the record and queues it; Unavailable when the buffer is full."""
        if len(self._queue) >= self.buffer_limit:
            self._set_accepting(False)
            metrics.AUDIT_REFUSED.inc()
            raise Unavailable(
                f"the audit log is unavailable ({len(self._queue)} records waiting for Redis); "
                "decisions are refused rather than left unaudited",
                retry_after_s=self.retry_max_s,
            )
        self._seq += 1
        # The record's fields as they are (all plain values; asdict would deep-copy each).
        fields = {name: getattr(record, name) for name in _RECORD_FIELDS}
        fields["rule_ids"] = list(record.rule_ids)
        if record.text is None:
            del fields["text"]
        fields.update(v=FORMAT_VERSION, kid=self.key_id, chain=self.chain, seq=self._seq, prev=self._prev)
        body = canonical(fields)
        digest = mac(self._hmac_key, body)
        self._prev = digest
        self._queue.append(_Entry(self._seq, digest, body))
        metrics.AUDIT_BUFFERED.set(len(self._queue))
        self._drained.clear()
        self._wake.set()

    async def flush(self, wait_s: float | None = None) -> bool:
        """Waits until every queued record is written (at most ``wait_s``); True if all were."""
        if not self._queue:
            return True
        self._wake.set()
        try:
            await asyncio.wait_for(self._drained.wait(), wait_s)
        except TimeoutError:
            return False
        return True

    async def close(self, wait_s: float = 5.0) -> None:
        """Writes what is queued (for at most ``wait_s``), then stops the writer."""
        flushed = await self.flush(wait_s)
        if not flushed:
            log.error("audit log closing with %d unwritten records (chain %s)", len(self._queue), self.chain)
        self._stopping.set()
        self._wake.set()
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def _set_accepting(self, value: bool) -> None:
        if value != self._accepting:
            self._accepting = value
            log.warning(
                "audit log %s", "accepting records again" if value else "buffer full: refusing decisions"
            )
            if self.on_accepting_change is not None:
                self.on_accepting_change(value)

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [self._queue[i] for i in range(min(self.batch_size, len(self._queue)))]
            args: list[str | int] = [self.chain]
            for entry in batch:
                args.extend((entry.seq, entry.hash, entry.record))
            try:
                await self._script(keys=[stream_key(self.key), heads_key(self.key)], args=args)
            except Exception as exc:  # redis errors of every kind: keep the records, retry later
                if self.redis_ok:
                    log.error(
                        "audit log cannot reach Redis (%s); buffering %d records", exc, len(self._queue)
                    )
                self.redis_ok = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=backoff)
                backoff = min(backoff * 2, self.retry_max_s)
                continue
            for _ in batch:
                self._queue.popleft()
            if not self._queue:
                self._drained.set()
            self.written += len(batch)
            metrics.AUDIT_WRITTEN.inc(len(batch))
            metrics.AUDIT_BUFFERED.set(len(self._queue))
            if not self.redis_ok:
                log.warning("audit log reached Redis again; %d records still buffered", len(self._queue))
            self.redis_ok = True
            backoff = 0.1
            if len(self._queue) < self.buffer_limit:
                self._set_accepting(True)


def cli(argv: list[str]) -> int:
    """``llmesh audit verify|trim``.

    verify: exit 0 if every chain is intact, 1 if a record was removed or altered (or is not
    chained with one of the given HMAC keys), 2 if Redis cannot be read or no key is given.
    trim: removes records older than ``--older-than-days`` (each chain keeps a checkpoint,
    so verify still checks what is left), exit 0, or 2 if Redis cannot be reached.
    """
    parser = argparse.ArgumentParser(prog="llmesh audit", description="Inspect the policy audit log.")
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("verify", help="check the hash chains: report removed or altered records")
    trim = sub.add_parser("trim", help="remove old records, keeping a checkpoint per chain")
    trim.add_argument("--older-than-days", type=float, required=True)
    for command in (check, trim):
        command.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
        command.add_argument("--key", default=os.environ.get("LLMESH_POLICY_AUDIT_KEY") or DEFAULT_KEY)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--hmac-key-file",
        action="append",
        default=[],
        help="file holding the HMAC key the policy service chains with (repeat for a log that spans a "
        "key rotation); default: $LLMESH_POLICY_AUDIT_HMAC_KEY, $LLMESH_POLICY_AUDIT_HMAC_KEY_FILE, "
        "or the key `llmesh up` uses in the data directory",
    )
    args = parser.parse_args(argv)
    if args.action == "trim":
        cutoff_ms = int((time.time() - args.older_than_days * 86400) * 1000)
        return asyncio.run(_trim_main(args.redis_url, args.key, cutoff_ms))
    try:
        keys = verifier_keys(args.hmac_key_file)
    except FailedPrecondition as exc:
        print(f"cannot verify the audit log: {exc.message}", file=sys.stderr)
        return 2
    return asyncio.run(_verify_main(args.redis_url, args.key, keys, as_json=args.json))


def _client(url: str) -> Any:
    from services.runtime import redis_client

    return redis_client.connect(url, socket_connect_timeout=3, socket_timeout=10)


async def _trim_main(url: str, key: str, cutoff_ms: int) -> int:
    from redis.exceptions import RedisError

    from policy.audit_check import trim

    client = _client(url)
    try:
        removed = await trim(client, key, cutoff_ms)
    except (RedisError, OSError) as exc:
        print(f"cannot trim the audit log at {url}: {exc}", file=sys.stderr)
        return 2
    finally:
        await client.aclose()
    print(f"audit log {key}: removed {removed} records older than {cutoff_ms} ms (checkpoints kept)")
    return 0


async def _verify_main(url: str, key: str, hmac_keys: list[bytes], *, as_json: bool) -> int:
    from redis.exceptions import RedisError

    from policy.audit_check import verify

    client = _client(url)
    try:
        report = await verify(client, key, hmac_keys)
    except (RedisError, OSError) as exc:
        print(f"cannot read the audit log at {url}: {exc}", file=sys.stderr)
        return 2
    finally:
        await client.aclose()
    if as_json:
        print(
            json.dumps(
                {
                    "ok": report.ok,
                    "records": report.records,
                    "chains": report.chains,
                    "problems": [asdict(p) for p in report.problems],
                },
                indent=2,
            )
        )
    else:
        for p in report.problems:
            where = f" entry {p.entry_id}" if p.entry_id else ""
            print(f"chain {p.chain} seq {p.seq}{where}: {p.reason}")
        status = "OK" if report.ok else f"{len(report.problems)} problem(s)"
        print(f"audit log {key}: {report.records} records in {report.chains} chain(s): {status}")
    return 0 if report.ok else 1
