"""The content policy on ingested text: CheckInput's ``documents``, as for retrieved chunks.

A file's text goes to the policy service in pieces of a few chunks each, as retrieved
documents, several per call within the service's text limit: the rules that scan documents
(indirect prompt injection, and every input rule) see all of it before any of it is stored.
A block fails the attach with the rules and their messages; a redaction is not applied to
stored text (as with retrieved chunks, which are checked again when a chat request retrieves
them). The policy service down fails the attach, unless the tenant fails open (then the text
is stored unchecked, and its chunks are still checked when retrieved).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import grpc
from llmesh.v1 import policy_pb2, policy_pb2_grpc

from gateway.stages.policy import BLOCK, DOWN
from services.runtime.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

# A file's text reaches the policy as documents of at most this many characters: a few
# retrieved chunks' worth, cut at paragraph boundaries, so each rule sees about what it sees
# of a retrieved chunk (and a ruleset's max_length rule, which applies per document, holds).
POLICY_DOCUMENT_CHARS = 4000


class DocumentBlocked(InvalidArgument):
    """The policy blocked the file's text."""

    def __init__(self, rule_ids: Sequence[str], messages: Sequence[str]) -> None:
        ids = ", ".join(rule_ids) or "unknown"
        reasons = "; ".join(m for m in messages if m)
        super().__init__(
            f"the file was blocked by the content policy (rules: {ids})" + (f": {reasons}" if reasons else "")
        )
        self.rule_ids = list(rule_ids)


class DocumentPolicy(Protocol):
    async def check(self, texts: Sequence[str], fail_open: bool) -> None:
        """DocumentBlocked on a block; Unavailable when the policy cannot answer and the tenant
        fails closed."""
        ...


class GrpcDocumentPolicy:
    """:class:`DocumentPolicy` over the PolicyService stub (None: no policy service, no check)."""

    def __init__(self, stub: policy_pb2_grpc.PolicyServiceAsyncStub | None) -> None:
        self._stub = stub

    async def check(self, texts: Sequence[str], fail_open: bool) -> None:
        if self._stub is None or not texts:
            return
        try:
            reply = await self._stub.CheckInput(policy_pb2.CheckInputRequest(documents=list(texts)))
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in DOWN:
                raise
            if not fail_open:
                raise Unavailable(
                    f"the policy service is unavailable ({exc.code().name}): the file's text cannot be "
                    "checked"
                ) from exc
            log.warning(
                "policy service unavailable (%s): ingesting unchecked (tenant fails open)", exc.code().name
            )
            return
        if reply.action == BLOCK:
            blocking = [f for f in reply.findings if f.action == BLOCK]
            rule_ids = sorted({f.rule_id for f in blocking})
            messages = list(dict.fromkeys(f.message for f in blocking))
            raise DocumentBlocked(rule_ids, messages)
