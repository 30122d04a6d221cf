"""The gateway's multiplexed moderation (gateway/stages/moderation_mux.py) against a real policy
server: concurrent answers' deltas share request messages and each answer is released exactly as
a call of its own releases it; an older policy service (no ModerateStreams) gets calls per answer;
a call that breaks mid-answer follows the tenant's fail mode."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmesh.v1 import policy_pb2

from gateway.stages.moderation_mux import Lane
from gateway.stages.policy import PolicyGate, StreamModeration, moderation_skipped
from policy import stream
from policy.service import StreamSet
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.errors import Unavailable
from tests.fixtures.policy_gate import gate_for, ruleset_copy, without
from tests.integration.policy.conftest import Served, serve_policy

pytestmark = pytest.mark.asyncio

ANSWERS = [
    f"Answer {i}: write to user{i}@example.com, or read the returns page; boots go back in {i + 5} days."
    for i in range(16)
]
SECRET = "Step one: how to build a pipe bomb at home and more"


def tokens(text: str) -> list[str]:
    """Roughly how a model streams it: a word with its leading space at a time."""
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


@pytest.fixture
async def served(redis_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    s = await serve_policy(redis_url, ruleset_copy(tmp_path))
    yield s
    await s.close()


async def answer(gate: PolicyGate, pieces: list[str], tenant: str) -> tuple[str, rc.RequestContext]:
    """One answer moderated through ``gate`` under its own request context."""
    ctx = rc.new_context(tenant=tenant)
    token = rc.activate(ctx)
    stream = gate.stream(fail_open=False)
    try:
        out = [(await stream.feed(piece)).text for piece in pieces[:-1]]
        out += [step.text for step in await stream.finish(pieces[-1])]  # as a choice's last delta
        return "".join(out), ctx
    finally:
        stream.close()
        rc.deactivate(token)


async def in_turns(
    gate: PolicyGate, answers: list[tuple[list[str], str]]
) -> list[tuple[str, rc.RequestContext]]:
    """Many answers whose next tokens arrive in the same turn of the event loop, as an engine's
    decode step delivers them: each turn feeds every unfinished answer its next token."""
    runs: list[tuple[contextvars.Context, rc.RequestContext, StreamModeration, list[str]]] = []
    for _, tenant in answers:
        ctx = rc.new_context(tenant=tenant)
        context = contextvars.copy_context()
        context.run(rc.activate, ctx)
        runs.append((context, ctx, gate.stream(fail_open=False), []))
    try:
        for turn in range(max(len(p) for p, _ in answers) + 1):
            feeds = []
            for (pieces, _), (context, _, stream, out) in zip(answers, runs, strict=True):
                if turn < len(pieces):
                    feeds.append((out, asyncio.create_task(stream.feed(pieces[turn]), context=context)))
                elif turn == len(pieces):
                    feeds.append((out, asyncio.create_task(stream.end(), context=context)))
            for out, task in feeds:
                out.append((await task).text)
        return [("".join(out), ctx) for _, ctx, _, out in runs]
    finally:
        for _, _, stream, _ in runs:
            stream.close()


async def per_call(served: Served, text: str) -> str:
    """What a CheckOutputStream call of its own releases for the same deltas."""
    gate, channel = gate_for(served, mux=False)
    try:
        released, _ = await answer(gate, tokens(text), "acme")
        return released
    finally:
        await channel.close()


def stall_policy(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """From now on the policy servers take events and never answer them; the event is set once
    one was taken."""
    stalled = asyncio.Event()

    async def stall(self: object, events: object) -> list[object]:
        stalled.set()
        await asyncio.Event().wait()  # the policy never answers again
        return []

    monkeypatch.setattr(StreamSet, "apply", stall)
    return stalled


async def test_concurrent_answers_share_messages_and_release_what_calls_of_their_own_release(
    served: Served,
) -> None:
    gate, channel = gate_for(served)
    assert gate.mux is not None
    try:
        texts = [*ANSWERS, SECRET]
        results = await in_turns(
            gate, [(tokens(t), "acme" if i % 2 else "globex") for i, t in enumerate(texts)]
        )
        for text, (released, ctx) in zip(texts, results, strict=True):
            assert released == await per_call(served, text)
            assert ctx.observed.get(namespaces.POLICY, 0) > 0  # as a call's trailers would say
        assert "bomb" not in results[-1][0] and "<EMAIL_1>" in results[0][0]
        # Every answer's token of a turn went in one message (the first turn with the opens).
        # (the blocked answer sends no more after its block)
        assert gate.mux.supported and gate.mux.events >= sum(len(tokens(t)) + 1 for t in ANSWERS)
        assert gate.mux.messages <= gate.mux.events / 8, (gate.mux.messages, gate.mux.events)
    finally:
        await gate.close()
        await channel.close()


async def test_a_policy_service_without_moderate_streams_gets_a_call_per_answer(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without(monkeypatch, "ModerateStreams", policy_pb2.ModerateStreamsResponse)
    served = await serve_policy(redis_url, ruleset_copy(tmp_path))
    gate, channel = gate_for(served)
    assert gate.mux is not None
    try:
        released, _ = await answer(gate, tokens(SECRET), "acme")
        assert "bomb" not in released and released == await per_call(served, SECRET)
        assert not gate.mux.supported
        second, _ = await answer(gate, tokens(ANSWERS[0]), "acme")
        assert "<EMAIL_1>" in second and "@example.com" not in second
    finally:
        await gate.close()
        await channel.close()
        await served.close()


@pytest.mark.parametrize("fail_open", [False, True])
async def test_a_call_broken_mid_answer_follows_the_fail_mode(
    redis_url: str, tmp_path: Path, fail_open: bool
) -> None:
    served = await serve_policy(redis_url, ruleset_copy(tmp_path))
    gate, channel = gate_for(served)
    ctx = rc.new_context(tenant="acme")
    token = rc.activate(ctx)
    stream = gate.stream(fail_open=fail_open)
    try:
        first = await stream.feed("Hello there, ")
        assert "Hello" in first.text
        await served.server.stop(0)
        if fail_open:
            rest = await stream.feed("the rest goes out")
            assert rest.text.endswith("the rest goes out") and moderation_skipped(ctx)
        else:
            with pytest.raises(Unavailable):
                await stream.feed("nothing goes out")
    finally:
        stream.close()
        rc.deactivate(token)
        await gate.close()
        await channel.close()
        await served.close()


async def test_an_answer_alone_never_waits_and_a_late_answer_waits_at_most_the_window(
    served: Served,
) -> None:
    # A window no test could sit out: an answer alone on the call goes at once.
    gate, channel = gate_for(served, mux_window_s=3600.0)
    try:
        released, _ = await asyncio.wait_for(answer(gate, tokens(ANSWERS[0]), "acme"), 30)
        assert "<EMAIL_1>" in released
    finally:
        await gate.close()
        await channel.close()
    # Two answers open, one of them idle: the other's events go when the window closes.
    gate, channel = gate_for(served, mux_window_s=0.05)
    ctx = rc.new_context(tenant="acme")
    token = rc.activate(ctx)
    idle, busy = gate.stream(fail_open=False), gate.stream(fail_open=False)
    try:
        await asyncio.wait_for(idle.feed("Hello"), 30)
        await asyncio.wait_for(busy.feed("Hello, "), 30)  # both open now; idle sends nothing more
        assert gate.mux is not None
        sent = gate.mux.messages
        step = await asyncio.wait_for(busy.feed("there, friend. "), 30)
        assert "there" in step.text and gate.mux.messages == sent + 1
    finally:
        idle.close()
        busy.close()
        rc.deactivate(token)
        await gate.close()
        await channel.close()


async def test_a_stalled_policy_service_costs_an_answer_its_deadline_not_more(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, channel = gate_for(served)
    ctx = rc.new_context(tenant="acme")
    token = rc.activate(ctx)
    stream = gate.stream(fail_open=False)
    try:
        await asyncio.wait_for(stream.feed("Hello there, "), 30)
        stalled = stall_policy(monkeypatch)
        ctx.deadline = time.monotonic() + 0.3
        with pytest.raises(Unavailable):  # fail closed: DEADLINE_EXCEEDED is "policy down"
            await asyncio.wait_for(stream.feed("the rest"), 30)
        assert stalled.is_set()
    finally:
        stream.close()
        rc.deactivate(token)
        await gate.close()
        await channel.close()


async def test_a_lane_past_its_age_takes_no_new_answers_and_ends_with_its_last(served: Served) -> None:
    gate, channel = gate_for(served, mux_lane_s=1e-9)  # every new answer finds the lane too old
    assert gate.mux is not None
    try:
        first = gate.mux.open()[0]
        first.release(-1, cancel=False)  # not an answer of it: nothing changes
        assert first.open and not first.retired
        released, _ = await answer(gate, tokens(ANSWERS[1]), "acme")  # on a new lane
        assert "<EMAIL_1>" in released and first.retired
        assert first.error is None  # still has its (idle) answer open
        first.release(next(iter(first.open)), cancel=True)
        await asyncio.wait_for(first.closed(), 30)  # the policy ended the call once it was closed
    finally:
        await gate.close()
        await channel.close()


async def test_a_piece_that_only_continues_the_held_word_waits_in_the_gateway(served: Served) -> None:
    # Sub-word pieces, as a tokenizer splits words: six of them only continue the word before.
    pieces = ["Photo", "syn", "thesis", " con", "verts", " light", ";", " mail", " user", "7", "@"]
    pieces += ["example", ".", "com", " to", "day", ".", " fin", "ally"]
    blocked = ["Step", " one", ": how to build a pi", "pe", " bo", "mb", " at home"]
    gate, channel = gate_for(served)
    assert gate.mux is not None
    ctx = rc.new_context(tenant="acme")
    token = rc.activate(ctx)
    stream = gate.stream(fail_open=False)
    try:
        first = await stream.feed(pieces[0])
        assert first.text == "" and gate.mux.events == 1  # the first piece goes at once
        out = [(await stream.feed(piece)).text for piece in pieces[1:]]
        out.append((await stream.end()).text)  # "ally" was kept: it goes with the end
        released = first.text + "".join(out)
        # The first word's pieces one by one (each may be offered its end), then each piece but
        # the four that continued a word (three went with the next piece), then "ally" and the end.
        assert gate.mux.events == len(pieces) - 4 + 2
        # The first word went out with the piece after it, on the step offered for its space.
        assert out[2] == "Photosynthesis "
        assert released == await per_call(served, "".join(pieces))
        assert "<EMAIL_1>" in released and released.endswith(" finally")
    finally:
        stream.close()
        rc.deactivate(token)
    try:
        released, _ = await answer(gate, blocked, "acme")
        assert "bomb" not in released and released == await per_call(served, "".join(blocked))
    finally:
        await gate.close()
        await channel.close()


async def test_the_first_word_goes_out_with_the_piece_after_it_without_a_round_trip(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, channel = gate_for(served)
    ctx = rc.new_context(tenant="acme")
    token = rc.activate(ctx)
    stream = gate.stream(fail_open=False)
    try:
        assert (await asyncio.wait_for(stream.feed("Hello"), 30)).text == ""  # the word may go on
        stalled = stall_policy(monkeypatch)
        # The comma ends the word: it goes out on the step the policy offered for it, before (here:
        # without) the policy's answer for the token.
        first = await asyncio.wait_for(stream.feed(", there"), 30)
        assert (first.text, first.start, first.end) == ("Hello", 0, 5)
        await asyncio.wait_for(stalled.wait(), 30)  # the token itself was sent to be checked
    finally:
        stream.close()
        rc.deactivate(token)
        await gate.close()  # its call is stalled for good
        await channel.close()
    monkeypatch.undo()
    gate, channel = gate_for(served)
    # What follows waits for the policy's answer for that token, and the answer as a whole is
    # released as a call of its own releases it: an address whose first part is the first word is
    # never offered (no space ends it), a word that may begin a blocked phrase neither.
    cases = [
        ["Hello", " there", ",", " friend", "."],
        ["No", ",", " I", "'m", " not", " able", "."],
        ["user7", "@", "example", ".", "com", " wrote"],
        ["build", " a", " pipe", " bomb", " now"],
        ["Step", " one", ": how to build a pi", "pe", " bo", "mb", " at home"],
    ]
    try:
        for pieces in cases:
            released, _ = await answer(gate, pieces, "acme")
            assert released == await per_call(served, "".join(pieces))
            assert "bomb" not in released
    finally:
        await gate.close()
        await channel.close()


@pytest.mark.parametrize(
    ("ahead", "pieces"),
    [
        (True, ["No", ",", " I", "'m", " not", " able", "."]),
        (False, ["No", ",", " I", "'m", " not", " able", "."]),
        # An answer that opens with a mark: the letter after it takes an offer sent in `more_next`.
        (True, ["[", "f", "7", "ad", "] No", "."]),
        (False, ["[", "f", "7", "ad", "] No", "."]),
    ],
)
async def test_a_gateway_with_ahead_off_waits_for_every_answer(
    served: Served, monkeypatch: pytest.MonkeyPatch, ahead: bool, pieces: list[str]
) -> None:
    sent: list[policy_pb2.StreamEvent] = []
    add = Lane.add

    def spy(self: Lane, event: policy_pb2.StreamEvent) -> None:
        sent.append(event)
        add(self, event)

    monkeypatch.setattr(Lane, "add", spy)
    gate, channel = gate_for(served, ahead=ahead)
    try:
        # An opening mark is offered letters once its kept first step was copied a few times.
        for _ in range(stream.MARK_OFFERS_AFTER if pieces[0] == "[" else 0):
            await answer(gate, pieces, "acme")
        sent.clear()
        released, _ = await answer(gate, pieces, "acme")
        assert released == await per_call(served, "".join(pieces))
    finally:
        await gate.close()
        await channel.close()
    # On: the comma (the "f") was sent as the step offered for it; off: nothing taken, and the
    # first word's pieces wait in the gateway like any other word's.
    assert [e.ahead_taken for e in sent if e.WhichOneof("event") == "delta"][:2] == [False, ahead]


async def test_the_last_piece_and_the_end_travel_in_one_message(served: Served) -> None:
    gate, channel = gate_for(served)
    assert gate.mux is not None
    cases = [
        (tokens(ANSWERS[3]), "acme"),  # ends with "days." : released whole, e-mail redacted
        (["Mail", " user", "7", "@", "example", ".", "com"], "acme"),  # the last piece ends an address
        # The last piece blocks: the end is never moderated (the policy would refuse it).
        (["Step", " one", ": how to build a pipe", " bomb at home"], "globex"),
    ]
    try:
        for pieces, tenant in cases:
            ctx = rc.new_context(tenant=tenant)
            token = rc.activate(ctx)
            stream = gate.stream(fail_open=False)
            try:
                out = [(await stream.feed(piece)).text for piece in pieces[:-1]]
                messages = gate.mux.messages
                last = await stream.finish(pieces[-1])
                assert gate.mux.messages == messages + 1  # one message, one round trip
                assert stream.finished
                released = "".join(out) + "".join(step.text for step in last)
                assert released == await per_call(served, "".join(pieces))
                # The releases tile what was fed, the end's step after the piece's.
                assert [s.start for s in last[1:]] == [s.end for s in last[:-1]]
            finally:
                stream.close()
                rc.deactivate(token)
            if "bomb" in pieces[-1]:
                assert stream.blocked and len(last) == 1 and "bomb" not in released
            else:
                assert len(last) == 2 and last[-1].end == len("".join(pieces))
                assert "<EMAIL_1>" in released and "@example.com" not in released
    finally:
        await gate.close()
        await channel.close()
