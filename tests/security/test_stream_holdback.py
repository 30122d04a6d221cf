"""Streamed output moderation never releases what a whole-answer check would remove.

Issue 14: a PEM private key fed in small deltas to CheckOutputStream came out whole, because
the hold-back bound forced the start of the (longer) match out and a match that began in
released text was never checked again. Here the real policy service answers over gRPC (on
the real Redis); the property test drives the same moderator the service runs.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llmesh.v1 import policy_pb2

from policy.config import DEFAULT_RULESET
from policy.engine import Segment, check_segments
from policy.rules import Action, RulesetError, Scope, parse_ruleset
from policy.stream import StreamModerator
from tests.fixtures.policy_stream import released_in_chunks
from tests.integration.policy.conftest import Served, serve_policy, tenant_md


def _pem(seed: int) -> str:
    raw = hashlib.sha512(str(seed).encode()).digest() * 14
    body = base64.b64encode(raw).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{lines}\n-----END RSA PRIVATE KEY-----"


PEM = _pem(1)
ACME = tenant_md("acme")
ANSWER = f"Here is the key you asked for:\n{PEM}\nStore it somewhere safe."

# A rule that declares a shorter span than its pattern can match: the moderator's backstop
# (never release a redacting or blocking match past the bound) is what keeps it in.
TIGHT = """
hold_back_chars: 48
rules:
  - id: pii
    detector: pii
    scope: output
    action: redact
    options: {entities: [CREDIT_CARD, PHONE, US_SSN]}
  - id: vault-token
    detector: regex
    scope: output
    action: redact
    options: {patterns: ['VAULT-[A-Z0-9]{4,}'], ignore_case: false, max_span: 40, entity_type: VAULT}
  - id: launch-code
    detector: regex
    scope: output
    action: block
    options: {patterns: ['LAUNCH:[0-9]{8,}'], ignore_case: false, max_span: 40}
"""


@pytest.fixture
async def policy(redis_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    path = tmp_path / "ruleset.yaml"
    shutil.copy(DEFAULT_RULESET, path)
    served = await serve_policy(redis_url, path)
    try:
        yield served
    finally:
        await served.close()


async def _stream(
    served: Served, text: str, size: int, tenant: str = "acme"
) -> list[policy_pb2.CheckOutputStreamResponse]:
    # Lockstep, as the gateway moderates: one delta, its answer, the next delta. A stream the
    # policy ends (a block) takes no more deltas; writing on regardless races the server's close.
    call = served.stub.CheckOutputStream(metadata=tenant_md("acme"))
    requests = [
        *(policy_pb2.CheckOutputStreamRequest(delta=text[i : i + size]) for i in range(0, len(text), size)),
        policy_pb2.CheckOutputStreamRequest(end=True),
    ]
    replies: list[policy_pb2.CheckOutputStreamResponse] = []
    for request in requests:
        await call.write(request)
        reply = await call.read()
        assert isinstance(reply, policy_pb2.CheckOutputStreamResponse), reply
        replies.append(reply)
        if reply.final:
            break
    await call.done_writing()
    return replies


@pytest.mark.parametrize("size", [1, 4, 17])
async def test_a_streamed_private_key_is_redacted_like_the_whole_answer(policy: Served, size: int) -> None:
    whole = await policy.stub.CheckOutput(
        policy_pb2.CheckOutputRequest(text=ANSWER), metadata=tenant_md("acme")
    )
    assert whole.action == policy_pb2.POLICY_ACTION_REDACT
    assert "PRIVATE KEY" not in whole.redacted_text

    replies = await _stream(policy, ANSWER, size)
    released = "".join(r.text for r in replies)
    assert replies[-1].final and replies[-1].action == policy_pb2.POLICY_ACTION_REDACT
    assert released == whole.redacted_text
    assert "PRIVATE KEY" not in released and PEM.splitlines()[1] not in released
    assert {f.entity_type for r in replies for f in r.findings} == {"SECRET"}
    # Held back while the key was open, but never past the ruleset's bound.
    bound = (
        await policy.stub.GetRuleset(policy_pb2.GetRulesetRequest(), metadata=tenant_md("acme"))
    ).hold_back_chars
    assert max(r.held_back for r in replies) <= bound


async def test_a_ruleset_whose_rule_outspans_the_bound_is_refused(policy: Served) -> None:
    # The old default (hold_back_chars: 128) with the pii rule, whose key blocks span thousands.
    before = await policy.stub.GetRuleset(policy_pb2.GetRulesetRequest(), metadata=tenant_md("acme"))
    policy.ruleset_path.write_text(
        DEFAULT_RULESET.read_text().replace("hold_back_chars: 8448", "hold_back_chars: 128")
    )
    assert not await policy.app.service.reload_file_if_changed()
    after = await policy.stub.GetRuleset(policy_pb2.GetRulesetRequest(), metadata=tenant_md("acme"))
    assert after.version == before.version
    with pytest.raises(RulesetError, match=r"rule 'pii'.*8382 characters.*hold_back_chars \(128\)"):
        parse_ruleset(policy.ruleset_path.read_bytes(), "file")
    # A tenant's own bound is checked against the rules that tenant gets.
    with pytest.raises(RulesetError, match=r"rule 'pii' \(tenant 'acme'\)"):
        parse_ruleset(
            DEFAULT_RULESET.read_text().replace("tenants: {}", "tenants: {acme: {hold_back_chars: 300}}"), "x"
        )


async def test_a_service_started_on_such_a_ruleset_refuses_to_start(redis_url: str, tmp_path: Path) -> None:
    path = tmp_path / "ruleset.yaml"
    path.write_text(TIGHT.replace("max_span: 40, entity_type", "max_span: 400, entity_type"))
    with pytest.raises(RulesetError, match="rule 'vault-token'"):
        await serve_policy(redis_url, path)


async def test_a_match_that_outgrows_the_bound_is_swallowed_or_blocks(redis_url: str, tmp_path: Path) -> None:
    path = tmp_path / "ruleset.yaml"
    path.write_text(TIGHT)
    served = await serve_policy(redis_url, path)
    try:
        token = "VAULT-" + "AB12" * 60  # 246 characters: far past the 40 declared and the 48 bound
        text = f"token {token} then more words"
        replies = await _stream(served, text, 4)
        released = "".join(r.text for r in replies)
        assert released == "token <VAULT_1> then more words"
        whole = await served.stub.CheckOutput(
            policy_pb2.CheckOutputRequest(text=text), metadata=tenant_md("acme")
        )
        assert whole.redacted_text == released

        code = "LAUNCH:" + "7" * 200
        replies = await _stream(served, f"the code is {code} ok", 4)
        released = "".join(r.text for r in replies)
        assert replies[-1].final and replies[-1].action == policy_pb2.POLICY_ACTION_BLOCK
        assert "LAUNCH" not in released and "7777" not in released
    finally:
        await served.close()


# --- property: whatever the chunking, nothing a whole-answer check removes is released ---

DEFAULT = parse_ruleset(DEFAULT_RULESET.read_bytes(), "default").for_tenant("t")
TIGHT_RULES = parse_ruleset(TIGHT, "tight").for_tenant("t")

_PIECES = [
    "Sure, here it is: ",
    PEM,
    _pem(2)[:400],  # a key that never ends
    "mail bob.smith@example.com ",
    "call +1 (202) 555-0143 now. ",
    "card 4111 1111 1111 1111 ",
    "key sk-proj-abcDEF123456ghiJKL7890mnoPQR ",
    "password: hunter2hunter2 ",
    "VAULT-" + "Z9" * 40 + " ",
    "LAUNCH:" + "12345678" * 8 + " ",
    "-----END RSA PRIVATE KEY----- ",
    "plain words and more plain words ",
    "x" * 300,
    "\n",
]


def _released(ruleset_name: str, text: str, cuts: list[int]) -> tuple[str, StreamModerator]:
    moderator = StreamModerator(DEFAULT if ruleset_name == "default" else TIGHT_RULES)
    return released_in_chunks(moderator, text, cuts), moderator


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["default", "tight"]),
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6),
    st.lists(st.integers(min_value=0, max_value=3000), max_size=60),
)
def test_no_chunking_releases_what_check_output_removes(name: str, parts: list[str], cuts: list[int]) -> None:
    ruleset = DEFAULT if name == "default" else TIGHT_RULES
    text = "".join(parts)
    whole = check_segments(ruleset, Scope.OUTPUT, [Segment(text, 0)])
    released, moderator = _released(name, text, cuts)
    if whole.action == Action.BLOCK:
        assert moderator.action == Action.BLOCK
        return
    for f in whole.findings:
        if f.action == Action.REDACT:
            # Not more copies of the removed text than the whole check leaves (the same string
            # may also stand elsewhere in the answer, where no rule matches it).
            removed = text[f.start : f.end]
            assert released.count(removed) <= whole.redacted[0].count(removed), f
    if name == "default":
        # Every default rule fits the bound: the stream agrees with the whole check exactly.
        assert released == whole.redacted[0]
