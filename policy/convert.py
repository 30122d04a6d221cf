"""Protos to policy domain types and back.

(Requests that protobuf cannot parse, e.g. invalid UTF-8 in a string field, are
refused with INVALID_ARGUMENT by the runtime's server interceptor.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from google.protobuf.message import Message
from llmesh.v1 import common_pb2, policy_pb2

from policy.engine import Decision, Finding
from policy.rules import Ruleset
from policy.service import (
    ChatText,
    InputRequest,
    InputResult,
    InputText,
    OutputCheck,
    ReloadResult,
    StreamEvent,
    StreamSetStep,
)
from policy.stream import StreamStep
from services.runtime.status import status_for

M = TypeVar("M", bound=Message)

_ROLE_NAMES = {v: k.removeprefix("ROLE_").lower() for k, v in common_pb2.Role.items()}


def messages_from_pb(messages: Sequence[common_pb2.ChatMessage]) -> list[ChatText]:
    return [ChatText(_ROLE_NAMES.get(m.role, "unspecified"), m.content) for m in messages]


_Messages = list[common_pb2.ChatMessage]
_Tools = list[common_pb2.ToolDefinition]
# Writes a redacted text back into the copies of the request's messages and tools.
_Setter = Callable[[_Messages, _Tools, str], None]


def _set_name(i: int) -> _Setter:
    def put(
        messages: list[common_pb2.ChatMessage], tools: list[common_pb2.ToolDefinition], text: str
    ) -> None:
        messages[i].name = text

    return put


def _set_call(i: int, j: int, attr: str) -> _Setter:
    def put(
        messages: list[common_pb2.ChatMessage], tools: list[common_pb2.ToolDefinition], text: str
    ) -> None:
        setattr(messages[i].tool_calls[j].function, attr, text)

    return put


def _set_tool(k: int, attr: str) -> _Setter:
    def put(
        messages: list[common_pb2.ChatMessage], tools: list[common_pb2.ToolDefinition], text: str
    ) -> None:
        setattr(tools[k].function, attr, text)

    return put


def input_texts_from_pb(
    messages: Sequence[common_pb2.ChatMessage], tools: Sequence[common_pb2.ToolDefinition]
) -> list[tuple[InputText, _Setter]]:
    """Every client text of a request besides message contents, with where to write it back."""
    out: list[tuple[InputText, _Setter]] = []
    for i, m in enumerate(messages):
        role = _ROLE_NAMES.get(m.role, "unspecified")
        if m.name:
            out.append((InputText(f"messages[{i}].name", m.name, i, role), _set_name(i)))
        for j, call in enumerate(m.tool_calls):
            at = f"messages[{i}].tool_calls[{j}].function"
            if call.function.name:
                out.append((InputText(f"{at}.name", call.function.name, i, role), _set_call(i, j, "name")))
            if call.function.arguments:
                item = InputText(f"{at}.arguments", call.function.arguments, i, role, json=True)
                out.append((item, _set_call(i, j, "arguments")))
    for k, tool in enumerate(tools):
        at = f"tools[{k}].function"
        fn = tool.function
        for attr, text, is_json in (
            ("name", fn.name, False),
            ("description", fn.description, False),
            ("parameters_json", fn.parameters_json, True),
        ):
            if text:
                out.append((InputText(f"{at}.{attr}", text, json=is_json), _set_tool(k, attr)))
    return out


def finding_to_pb(f: Finding) -> policy_pb2.Finding:
    return policy_pb2.Finding(
        rule_id=f.rule_id,
        detector=f.detector,
        action=int(f.action),  # type: ignore[arg-type]  # Action mirrors PolicyAction's numbers
        message=f.message,
        entity_type=f.entity_type,
        message_index=f.message_index,
        start=f.start,
        end=f.end,
        score=f.score,
        document_index=f.document_index,
        field=f.field,
    )


def check_input_to_pb(
    decision: Decision,
    messages: Sequence[common_pb2.ChatMessage],
    tools: Sequence[common_pb2.ToolDefinition] = (),
    texts: Sequence[tuple[InputText, _Setter]] = (),
) -> policy_pb2.CheckInputResponse:
    """The response: ``decision.redacted`` holds the contents, then ``texts`` (same order)."""
    redacted = [_copy(m) for m in messages]
    redacted_tools = [_copy(t) for t in tools]
    for copy, text in zip(redacted, decision.redacted[: len(messages)], strict=True):
        copy.content = text
    for (item, put), text in zip(texts, decision.redacted[len(messages) :], strict=True):
        if text != item.text:
            put(redacted, redacted_tools, text)
    return policy_pb2.CheckInputResponse(
        action=int(decision.action),  # type: ignore[arg-type]
        findings=[finding_to_pb(f) for f in decision.findings],
        redacted_messages=redacted,
        ruleset_version=decision.ruleset_version,
        text_sha256=decision.text_sha256,
        redacted_tools=redacted_tools,
    )


def _copy(message: M) -> M:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def check_output_to_pb(result: OutputCheck) -> policy_pb2.CheckOutputResponse:
    return policy_pb2.CheckOutputResponse(
        action=int(result.decision.action),  # type: ignore[arg-type]
        findings=[finding_to_pb(f) for f in result.decision.findings],
        redacted_text=result.released,
        ruleset_version=result.decision.ruleset_version,
        text_sha256=result.text_sha256,
        response_sha256=result.response_sha256,
    )


def step_to_pb(step: StreamStep, ruleset_version: str) -> policy_pb2.CheckOutputStreamResponse:
    return policy_pb2.CheckOutputStreamResponse(
        text=step.text,
        action=int(step.action),  # type: ignore[arg-type]
        findings=[finding_to_pb(f) for f in step.findings],
        held_back=step.held_back,
        final=step.final,
        response_sha256=step.response_sha256,
        ruleset_version=ruleset_version,
        ahead=[
            policy_pb2.AheadStep(next=a.next, text=a.text, held_back=a.held_back, more_next=a.more)
            for a in step.ahead
        ],
    )


def ruleset_to_pb(ruleset: Ruleset) -> policy_pb2.GetRulesetResponse:
    return policy_pb2.GetRulesetResponse(
        version=ruleset.version,
        rules=[
            policy_pb2.Rule(
                id=r.id,
                detector=r.detector_name,
                scope=int(r.scope),  # type: ignore[arg-type]
                action=int(r.action),  # type: ignore[arg-type]
                message=r.message,
                options_json=json.dumps(r.options, sort_keys=True, default=str),
                roles=sorted(r.roles or ()),
            )
            for r in ruleset.rules
        ],
        source=ruleset.source,
        hold_back_chars=ruleset.hold_back_chars,
    )


def reload_to_pb(result: ReloadResult) -> policy_pb2.ReloadRulesResponse:
    return policy_pb2.ReloadRulesResponse(
        version=result.version, rule_count=result.rule_count, policy_version=result.policy_version
    )


def stream_events_from_pb(events: Iterable[policy_pb2.StreamEvent]) -> list[StreamEvent]:
    out = []
    for e in events:
        kind = e.WhichOneof("event") or ""
        opened = (e.open.tenant, e.open.request_id) if e.HasField("open") else None
        out.append(StreamEvent(e.stream, kind, e.delta, opened, e.ahead_taken))
    return out


def stream_steps_to_pb(steps: Iterable[StreamSetStep]) -> policy_pb2.ModerateStreamsResponse:
    reply = policy_pb2.ModerateStreamsResponse()
    for s in steps:
        out = reply.steps.add(stream=s.stream)
        if s.error is not None:
            code, message, _ = status_for(s.error, "")
            out.error_code = code.value[0]
            out.error = message
            continue
        assert s.step is not None
        out.step.CopyFrom(step_to_pb(s.step, s.ruleset_version))
        if s.policy_version is not None:
            out.policy_version = s.policy_version
    return reply


def input_checks_from_pb(
    checks: Iterable[policy_pb2.InputCheck],
) -> tuple[list[InputRequest], list[list[tuple[InputText, _Setter]]]]:
    """The checks of a CheckInputs call, and each one's texts with their setters (for the
    redacted copies, :func:`check_input_to_pb`)."""
    requests: list[InputRequest] = []
    texts: list[list[tuple[InputText, _Setter]]] = []
    for check in checks:
        found = input_texts_from_pb(check.input.messages, check.input.tools)
        requests.append(
            InputRequest(
                check.tenant,
                check.request_id,
                messages_from_pb(check.input.messages),
                list(check.input.documents),
                [t for t, _ in found],
                check.traceparent,
            )
        )
        texts.append(found)
    return requests, texts


def input_result_to_pb(
    check: policy_pb2.InputCheck, result: InputResult, texts: Sequence[tuple[InputText, _Setter]]
) -> policy_pb2.CheckInputsResponse:
    out = policy_pb2.CheckInputsResponse()
    if result.error is not None:
        code, message, _ = status_for(result.error, check.request_id)
        out.error_code = code.value[0]
        out.error = message
        return out
    assert result.decision is not None
    request = check.input
    out.verdict.CopyFrom(check_input_to_pb(result.decision, request.messages, request.tools, texts))
    if result.policy_version is not None:
        out.policy_version = result.policy_version
    return out
