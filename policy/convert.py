"""Protos to policy domain types and back.

(Requests that protobuf cannot parse, e.g. invalid UTF-8 in a string field, are
refused with INVALID_ARGUMENT by the runtime's server interceptor.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeVar

from google.protobuf.message import Message
from llmesh.v1 import common_pb2, policy_pb2

from policy.engine import Decision, Finding
from policy.rules import Ruleset
from policy.service import ChatText, OutputCheck, ReloadResult
from policy.stream import StreamStep

M = TypeVar("M", bound=Message)

_ROLE_NAMES = {v: k.removeprefix("ROLE_").lower() for k, v in common_pb2.Role.items()}


def messages_from_pb(messages: Sequence[common_pb2.ChatMessage]) -> list[ChatText]:
    return [ChatText(_ROLE_NAMES.get(m.role, "unspecified"), m.content) for m in messages]


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
    )


def check_input_to_pb(
    decision: Decision, messages: Sequence[common_pb2.ChatMessage]
) -> policy_pb2.CheckInputResponse:
    redacted = []
    for original, text in zip(messages, decision.redacted, strict=True):
        copy = common_pb2.ChatMessage()
        copy.CopyFrom(original)
        copy.content = text
        redacted.append(copy)
    return policy_pb2.CheckInputResponse(
        action=int(decision.action),  # type: ignore[arg-type]
        findings=[finding_to_pb(f) for f in decision.findings],
        redacted_messages=redacted,
        ruleset_version=decision.ruleset_version,
        text_sha256=decision.text_sha256,
    )


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
