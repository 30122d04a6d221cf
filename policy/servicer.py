"""PolicyService over gRPC: proto in, domain call, proto out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from llmesh.v1 import policy_pb2, policy_pb2_grpc

from policy import convert
from policy.service import PolicyService

SERVICE_NAME = "llmesh.v1.PolicyService"


class PolicyServicer(policy_pb2_grpc.PolicyServiceServicer):
    """Thin adapter over :class:`policy.service.PolicyService`."""

    def __init__(self, service: PolicyService) -> None:
        self.service = service

    async def CheckInput(
        self,
        request: policy_pb2.CheckInputRequest,
        context: grpc.aio.ServicerContext[policy_pb2.CheckInputRequest, policy_pb2.CheckInputResponse],
    ) -> policy_pb2.CheckInputResponse:
        """Checks a request's messages, tool definitions and retrieved documents; returns findings
        and redactions."""
        req = request
        texts = convert.input_texts_from_pb(req.messages, req.tools)
        decision = await self.service.check_input(
            convert.messages_from_pb(req.messages), list(req.documents), [t for t, _ in texts]
        )
        return convert.check_input_to_pb(decision, req.messages, req.tools, texts)

    async def CheckInputs(
        self,
        request: policy_pb2.CheckInputsRequest,
        context: grpc.aio.ServicerContext[policy_pb2.CheckInputsRequest, policy_pb2.CheckInputsResponse],
    ) -> AsyncIterator[policy_pb2.CheckInputsResponse]:
        """Many requests' input checks, each naming its tenant; one response per check, in order,
        as soon as it is done."""
        self.service.check_count(len(request.checks))
        checks, texts = convert.input_checks_from_pb(request.checks)
        i = 0
        async for result in self.service.check_inputs(checks):
            yield convert.input_result_to_pb(request.checks[i], result, texts[i])
            i += 1

    async def CheckOutput(
        self,
        request: policy_pb2.CheckOutputRequest,
        context: grpc.aio.ServicerContext[policy_pb2.CheckOutputRequest, policy_pb2.CheckOutputResponse],
    ) -> policy_pb2.CheckOutputResponse:
        """Checks a whole answer."""
        req = request
        return convert.check_output_to_pb(await self.service.check_output(req.text))

    async def CheckOutputStream(
        self,
        request_iterator: AsyncIterator[policy_pb2.CheckOutputStreamRequest],
        context: grpc.aio.ServicerContext[
            policy_pb2.CheckOutputStreamRequest, policy_pb2.CheckOutputStreamResponse
        ],
    ) -> AsyncIterator[policy_pb2.CheckOutputStreamResponse]:
        """One response per request message: the text safe to release now; the last has final=true."""
        stream = await self.service.open_stream()
        version = stream.ruleset.version
        try:
            async for request in request_iterator:
                req = request
                step = (
                    stream.finish()
                    if req.WhichOneof("event") == "end"
                    else stream.feed(req.delta, ahead_taken=req.ahead_taken)
                )
                yield convert.step_to_pb(step, version)
                if step.final:
                    return
            if not stream.done:
                yield convert.step_to_pb(stream.finish(), version)
        finally:
            stream.close()

    async def ModerateStreams(
        self,
        request_iterator: AsyncIterator[policy_pb2.ModerateStreamsRequest],
        context: grpc.aio.ServicerContext[
            policy_pb2.ModerateStreamsRequest, policy_pb2.ModerateStreamsResponse
        ],
    ) -> AsyncIterator[policy_pb2.ModerateStreamsResponse]:
        """Many answers' moderation: one response per request message, its steps in order."""
        streams = self.service.stream_set()
        try:
            async for request in request_iterator:
                steps = await streams.apply(convert.stream_events_from_pb(request.events))
                yield convert.stream_steps_to_pb(steps)
        finally:
            streams.close()

    async def GetRuleset(
        self,
        request: policy_pb2.GetRulesetRequest,
        context: grpc.aio.ServicerContext[policy_pb2.GetRulesetRequest, policy_pb2.GetRulesetResponse],
    ) -> policy_pb2.GetRulesetResponse:
        """The calling tenant's active ruleset."""
        return convert.ruleset_to_pb(self.service.get_ruleset())

    async def ReloadRules(
        self,
        request: policy_pb2.ReloadRulesRequest,
        context: grpc.aio.ServicerContext[policy_pb2.ReloadRulesRequest, policy_pb2.ReloadRulesResponse],
    ) -> policy_pb2.ReloadRulesResponse:
        """Validates and swaps in a ruleset; bumps the tenants' policy versions."""
        req = request
        return convert.reload_to_pb(await self.service.reload(req.yaml))
