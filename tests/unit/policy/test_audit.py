from __future__ import annotations

import json

import pytest

from policy.audit import GENESIS, AuditLog, AuditRecord, record_hash
from policy.audit_check import check_entries
from policy.audit_key import mac
from services.runtime.errors import Unavailable
from tests.unit.policy.fakes import FakeScriptRedis

KEY = b"k" * 32
KEYS = [KEY]


def record(i: int) -> AuditRecord:
    return AuditRecord(f"req-{i}", "acme", "v1", ("pii",), "redact", "input", "ab" * 32)


async def written_log(n: int) -> tuple[AuditLog, FakeScriptRedis]:
    redis = FakeScriptRedis()
    log = AuditLog(redis, hmac_key=KEY, batch_size=3)
    log.start()
    for i in range(n):
        log.append(record(i))
    assert await log.flush(5)
    await log.close()
    return log, redis


async def test_records_form_a_hash_chain() -> None:
    _, redis = await written_log(7)
    bodies = [json.loads(f["record"]) for _, f in redis.entries]
    assert [b["seq"] for b in bodies] == list(range(1, 8))
    assert bodies[0]["prev"] == GENESIS
    for (_, prev), body in zip(redis.entries, bodies[1:], strict=False):
        assert body["prev"] == prev["hash"] == mac(KEY, prev["record"])
    assert "text" not in bodies[0]
    assert check_entries(redis.entries, redis.heads, keys=KEYS).ok


async def test_verify_detects_removed_and_altered_records() -> None:
    _, redis = await written_log(6)
    entries, heads = redis.entries, redis.heads

    removed_middle = entries[:2] + entries[3:]
    assert any("removed" in p.reason for p in check_entries(removed_middle, heads, keys=KEYS).problems)

    removed_first = entries[1:]
    assert any("removed" in p.reason for p in check_entries(removed_first, heads, keys=KEYS).problems)

    removed_tail = entries[:-1]
    assert any("at the end" in p.reason for p in check_entries(removed_tail, heads, keys=KEYS).problems)

    eid, fields = entries[2]
    tampered = dict(fields, record=fields["record"].replace('"redact"', '"allow"'))
    altered = [*entries[:2], (eid, tampered), *entries[3:]]
    assert any("altered" in p.reason for p in check_entries(altered, heads, keys=KEYS).problems)

    # Re-hashing the altered record with the key is caught by the next record's link.
    rehashed = dict(tampered, hash=mac(KEY, tampered["record"]))
    relinked = [*entries[:2], (eid, rehashed), *entries[3:]]
    assert any("previous hash" in p.reason for p in check_entries(relinked, heads, keys=KEYS).problems)

    # Without the key, a plain SHA-256 (the old chain) does not pass as the record's link.
    plain = [*entries[:2], (eid, dict(tampered, hash=record_hash(tampered["record"]))), *entries[3:]]
    assert any("altered" in p.reason for p in check_entries(plain, heads, keys=KEYS).problems)
    # Nor does the right chain checked with another key.
    assert any(
        "unauthenticated" in p.reason for p in check_entries(entries, heads, keys=[b"x" * 32]).problems
    )

    duplicated = [*entries, entries[-1]]
    assert any("duplicate" in p.reason for p in check_entries(duplicated, heads, keys=KEYS).problems)


async def test_buffers_while_redis_is_down_then_refuses() -> None:
    redis = FakeScriptRedis()
    redis.down = True
    changes: list[bool] = []
    log = AuditLog(redis, hmac_key=KEY, buffer_limit=3, retry_max_s=0.05, on_accepting_change=changes.append)
    log.start()
    for i in range(3):
        log.append(record(i))
    with pytest.raises(Unavailable):
        log.append(record(3))
    assert not log.accepting and changes == [False]
    assert not await log.flush(0.1)
    redis.down = False
    assert await log.flush(5)
    assert log.accepting and changes == [False, True]
    assert [int(f["seq"]) for _, f in redis.entries] == [1, 2, 3]
    assert check_entries(redis.entries, redis.heads, keys=KEYS).ok
    await log.close()


async def test_a_retried_batch_is_not_written_twice() -> None:
    redis = FakeScriptRedis()
    script = redis.register_script("")
    await script(keys=["s", "h"], args=["c", 1, "h1", "{}", 2, "h2", "{}"])
    await script(keys=["s", "h"], args=["c", 1, "h1", "{}", 2, "h2", "{}", 3, "h3", "{}"])
    assert [f["seq"] for _, f in redis.entries] == ["1", "2", "3"]


async def test_close_flushes() -> None:
    redis = FakeScriptRedis()
    log = AuditLog(redis, hmac_key=KEY)
    log.start()
    log.append(record(1))
    await log.close()
    assert len(redis.entries) == 1


async def test_a_checkpoint_lets_verification_start_after_a_trim() -> None:
    _, redis = await written_log(6)
    entries, heads = redis.entries, redis.heads
    (chain,) = heads
    third = entries[2][1]
    checkpoint = {chain: f"{third['seq']}:{third['hash']}"}
    assert check_entries(entries[3:], heads, checkpoint, keys=KEYS).ok
    assert not check_entries(
        entries[4:], heads, checkpoint, keys=KEYS
    ).ok  # a record past the checkpoint is gone
    assert not check_entries(entries[3:], heads, keys=KEYS).ok  # without the checkpoint the start is missing
