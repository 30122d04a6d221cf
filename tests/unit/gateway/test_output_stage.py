"""gateway/stages/output.py: which logprobs go out with which released text, and the tool-call
decisions that the scripted fake replica cannot reach (a redacted name, arguments that a
redaction would break). The whole path runs on the real services in tests/security."""

from __future__ import annotations

from unittest.mock import create_autospec

from llmesh.v1 import common_pb2

from gateway.stages.output import HeldLogprobs, moderate_tool_calls
from gateway.stages.policy import OutputVerdict, PolicyGate, Release


def _lp(*tokens: str) -> list[common_pb2.TokenLogprob]:
    return [common_pb2.TokenLogprob(token=t, logprob=-1.0) for t in tokens]


def _tokens(logprobs: list[common_pb2.TokenLogprob]) -> list[str]:
    return [lp.token for lp in logprobs]


def test_logprobs_wait_for_their_text_and_redacted_text_drops_them() -> None:
    held = HeldLogprobs()
    held.add(5, _lp("write"), with_tools=False)
    held.add(3, _lp(" to"), with_tools=False)
    assert held.release(Release("", 0, 0)) == []  # all held back
    assert _tokens(held.release(Release("write", 0, 5))) == ["write"]
    held.add(18, _lp(" alice@example.com"), with_tools=False)
    held.add(6, _lp(" today"), with_tools=False)
    # " to <EMAIL_1>" stands for [5, 26): redacted, so both tokens in it are dropped.
    assert held.release(Release(" to <EMAIL_1>", 5, 26, redacted=True)) == []
    assert _tokens(held.finish(32, clean=True)) == [" today"]


def test_tokens_without_text_belong_to_the_next_text() -> None:
    held = HeldLogprobs()
    held.add(0, _lp("\xe2\x82"), with_tools=False)  # half a character: no text yet
    assert held.release(Release("", 0, 0)) == []
    held.add(1, _lp("\xac"), with_tools=False)
    assert held.release(Release("X", 0, 1, redacted=True)) == []


def test_tool_call_tokens_wait_for_the_calls_and_go_only_when_unchanged() -> None:
    held = HeldLogprobs()
    held.add(0, _lp("<tool_call>"), with_tools=False)  # the parser's buffer, before the call shows
    held.add(0, _lp('{"a":'), with_tools=True)
    assert held.release(Release("", 0, 0)) == []
    assert _tokens(held.finish(0, clean=True)) == ["<tool_call>", '{"a":']
    held = HeldLogprobs()
    held.add(0, _lp('{"a":'), with_tools=True)
    assert held.finish(0, clean=False) == []


def test_text_never_released_drops_its_logprobs_at_the_end() -> None:
    held = HeldLogprobs()
    held.add(4, _lp("kept"), with_tools=False)
    held.add(4, _lp("lost"), with_tools=False)
    assert _tokens(held.finish(4, clean=True)) == ["kept"]


def _call(name: str, arguments: str) -> common_pb2.ToolCall:
    return common_pb2.ToolCall(id="c", function=common_pb2.FunctionCall(name=name, arguments=arguments))


def _gate(redactions: dict[str, str]) -> PolicyGate:
    gate = create_autospec(PolicyGate, instance=True)

    async def check_output(text: str, fail_open: bool) -> OutputVerdict:
        if text in redactions:
            return OutputVerdict(redactions[text], redacted=True)
        return OutputVerdict(text)

    gate.check_output.side_effect = check_output
    return gate  # type: ignore[no-any-return]


async def test_redacted_arguments_that_stay_json_are_sent_redacted() -> None:
    gate = _gate({'{"to": "a@b.c"}': '{"to": "<EMAIL_1>"}'})
    verdict = await moderate_tool_calls(gate, [_call("send", '{"to": "a@b.c"}')], False)
    assert not verdict.blocked and verdict.redacted
    assert verdict.calls[0].function.arguments == '{"to": "<EMAIL_1>"}'


async def test_a_redaction_that_breaks_the_json_or_a_name_blocks() -> None:
    broken = _gate({'{"to": "a@b.c"}': '{"to": <SECRET_1>'})
    assert (await moderate_tool_calls(broken, [_call("send", '{"to": "a@b.c"}')], False)).blocked
    renamed = _gate({"mail_a@b.c": "mail_<EMAIL_1>"})
    assert (await moderate_tool_calls(renamed, [_call("mail_a@b.c", "{}")], False)).blocked
