"""Checking and trimming the audit log (``llmesh audit verify`` / ``trim``).

A chain is intact when its records carry consecutive sequence numbers from its
start, each record's hash is the HMAC of its content under one of the verifier's
keys (:mod:`policy.audit_key`; a record of format 1, plain SHA-256, or of a key not
given, is reported: anyone who can write Redis could have made it), each ``prev`` is the hash of the
record before, and the chain's head (``<key>:heads``) names its last record. Its
start is the genesis hash, or, after a trim, the checkpoint the trim left
(``<key>:checkpoints``: the ``seq:hash`` of the last record it removed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policy.audit import FORMAT_VERSION, GENESIS, checkpoints_key, heads_key, stream_key
from policy.audit_key import key_id, mac

_ADVANCE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local seq = tonumber(string.match(cur or '0:', '^(%d+):'))
if tonumber(ARGV[2]) > seq then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3]) end
return 1
"""


@dataclass(frozen=True)
class Problem:
    chain: str
    seq: int
    entry_id: str
    reason: str


@dataclass
class VerifyReport:
    records: int = 0
    chains: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _seq_hash(value: str) -> tuple[int, str]:
    seq_text, _, digest = value.partition(":")
    return (int(seq_text) if seq_text.isdigit() else -1), digest


def check_entries(
    entries: Sequence[tuple[str, dict[str, str]]],
    heads: dict[str, str],
    checkpoints: dict[str, str] | None = None,
    *,
    keys: Sequence[bytes],
) -> VerifyReport:
    """Verifies stream entries (id, fields) in stream order against the chain heads and checkpoints,
    each record's link with the HMAC ``keys`` (several: a log that spans a key rotation)."""
    by_id = {key_id(k): k for k in keys}
    report = VerifyReport(records=len(entries))
    last: dict[str, tuple[int, str]] = {chain: _seq_hash(v) for chain, v in (checkpoints or {}).items()}
    for entry_id, fields in entries:
        chain = fields.get("chain", "")
        seq_text = fields.get("seq", "")
        body = fields.get("record", "")
        seq = int(seq_text) if seq_text.isdigit() else -1
        prev_seq, prev_hash = last.get(chain, (0, GENESIS))
        try:
            parsed = json.loads(body)
        except ValueError:
            report.problems.append(Problem(chain, seq, entry_id, "altered: the record is not JSON"))
            last[chain] = (seq, fields.get("hash", ""))
            continue
        kid = parsed.get("kid") if isinstance(parsed, dict) else None
        if not isinstance(parsed, dict) or parsed.get("v") != FORMAT_VERSION or kid not in by_id:
            version = parsed.get("v") if isinstance(parsed, dict) else None
            report.problems.append(
                Problem(
                    chain,
                    seq,
                    entry_id,
                    f"unauthenticated: format {version} record with key id {kid!r}, not chained with "
                    "any of the given HMAC keys (rewritten, or written with another key)",
                )
            )
        elif mac(by_id[str(kid)], body) != fields.get("hash"):
            report.problems.append(
                Problem(chain, seq, entry_id, "altered: the record does not match its HMAC")
            )
        if not isinstance(parsed, dict):
            last[chain] = (seq, fields.get("hash", ""))
            continue
        if parsed.get("chain") != chain or parsed.get("seq") != seq:
            report.problems.append(
                Problem(chain, seq, entry_id, "altered: chain or sequence fields disagree")
            )
        if seq <= prev_seq:
            report.problems.append(
                Problem(chain, seq, entry_id, f"duplicate or out of order after {prev_seq}")
            )
        elif seq != prev_seq + 1:
            report.problems.append(
                Problem(chain, seq, entry_id, f"removed: records {prev_seq + 1}..{seq - 1} are missing")
            )
        elif parsed.get("prev") != prev_hash:
            report.problems.append(
                Problem(chain, seq, entry_id, "altered or removed: the previous hash differs")
            )
        last[chain] = (seq, fields.get("hash", ""))
    for chain, head in heads.items():
        head_seq_text, _, head_hash = head.partition(":")
        head_seq = int(head_seq_text) if head_seq_text.isdigit() else -1
        seen_seq, seen_hash = last.get(chain, (0, GENESIS))
        if head_seq > seen_seq:
            report.problems.append(
                Problem(
                    chain, head_seq, "", f"removed: records {seen_seq + 1}..{head_seq} at the end are missing"
                )
            )
        elif head_seq == seen_seq and head_hash != seen_hash:
            report.problems.append(
                Problem(chain, head_seq, "", "altered: the last record differs from the head")
            )
    for chain in last:
        if chain not in heads:
            report.problems.append(
                Problem(chain, 0, "", "the chain has no head (the heads hash was altered)")
            )
    report.chains = len(set(last) | set(heads))
    return report


async def verify(redis: Any, key: str, hmac_keys: Sequence[bytes], page: int = 1000) -> VerifyReport:
    """Reads the whole stream and checks every chain with the HMAC keys."""
    entries: list[tuple[str, dict[str, str]]] = []
    start = "-"
    while True:
        batch = await redis.xrange(stream_key(key), min=start, max="+", count=page)
        if not batch:
            break
        for entry_id, fields in batch:
            entries.append((_text(entry_id), {_text(k): _text(v) for k, v in fields.items()}))
        start = "(" + _text(batch[-1][0])
        if len(batch) < page:
            break
    raw_heads = await redis.hgetall(heads_key(key))
    heads = {_text(k): _text(v) for k, v in raw_heads.items()}
    raw_checkpoints = await redis.hgetall(checkpoints_key(key))
    checkpoints = {_text(k): _text(v) for k, v in raw_checkpoints.items()}
    return check_entries(entries, heads, checkpoints, keys=hmac_keys)


async def trim(redis: Any, key: str, before_ms: int, page: int = 1000) -> int:
    """Removes the records written before ``before_ms`` (Unix ms); returns how many.

    Each chain's checkpoint first moves to its last record that goes, so a record removed
    by anything other than a trim is still reported by :func:`verify`.
    """
    boundary = f"({before_ms}-0"
    last: dict[str, tuple[int, str]] = {}
    start = "-"
    while True:
        batch = await redis.xrange(stream_key(key), min=start, max=boundary, count=page)
        if not batch:
            break
        for _, raw in batch:
            fields = {_text(k): _text(v) for k, v in raw.items()}
            chain, seq_text = fields.get("chain", ""), fields.get("seq", "")
            if seq_text.isdigit() and int(seq_text) > last.get(chain, (0, ""))[0]:
                last[chain] = (int(seq_text), fields.get("hash", ""))
        start = "(" + _text(batch[-1][0])
        if len(batch) < page:
            break
    advance = redis.register_script(_ADVANCE)
    for chain, (last_seq, digest) in last.items():
        await advance(keys=[checkpoints_key(key)], args=[chain, last_seq, digest])
    # Exact, not "~": an approximate trim may leave records behind the checkpoint just moved.
    return int(await redis.xtrim(stream_key(key), minid=f"{before_ms}-0", approximate=False))
