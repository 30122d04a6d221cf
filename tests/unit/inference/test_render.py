"""Request checks and the OpenAI request bodies handed to vLLM's OpenAI layer."""

from __future__ import annotations

import json

import pytest

from services.inference import render
from services.inference.types import (
    GenerateRequest,
    Message,
    ResponseFormat,
    Sampling,
    Tool,
    ToolCall,
    ToolChoice,
)
from services.runtime.errors import InvalidArgument

SCHEMA = json.dumps({"type": "object", "properties": {"city": {"type": "string"}}})


def test_input_needs_exactly_one_of_messages_and_prompt() -> None:
    with pytest.raises(InvalidArgument, match="messages is empty"):
        render.check_input([], None)
    with pytest.raises(InvalidArgument, match="not both"):
        render.check_input([Message("user", "hi")], "hi")
    with pytest.raises(InvalidArgument, match="prompt is empty"):
        render.check_input([], "")
    render.check_input([Message("user", "hi")], None)
    render.check_input([], "hi")


def test_roles_and_tool_messages_are_checked() -> None:
    with pytest.raises(InvalidArgument, match=r"messages\[1\]\.role 'robot'"):
        render.check_input([Message("user", "hi"), Message("robot", "beep")], None)
    with pytest.raises(InvalidArgument, match="without tool_call_id"):
        render.check_input([Message("tool", "42")], None)
    with pytest.raises(InvalidArgument, match="only assistant"):
        render.check_input([Message("user", "x", tool_calls=[ToolCall("1", "f", "{}")])], None)
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        render.check_input([Message("assistant", "", tool_calls=[ToolCall("1", "f", "{oops")])], None)


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (Sampling(max_tokens=0), "max_tokens must be > 0, got 0"),
        (Sampling(max_tokens=-3), "max_tokens must be > 0"),
        (Sampling(temperature=-0.1), "temperature must be >= 0"),
        (Sampling(temperature=float("nan")), "temperature must be >= 0"),
        (Sampling(top_p=0), r"top_p must be in \(0, 1\]"),
        (Sampling(top_p=1.5), "top_p"),
        (Sampling(top_k=-2), "top_k"),
        (Sampling(presence_penalty=3), "presence_penalty must be in"),
        (Sampling(frequency_penalty=-2.5), "frequency_penalty"),
        (Sampling(repetition_penalty=0), "repetition_penalty"),
        (Sampling(n=0), "n must be in"),
        (Sampling(n=17), "n must be in"),
        (Sampling(logprobs=True, top_logprobs=21), "top_logprobs must be in"),
        (Sampling(top_logprobs=2), "needs sampling.logprobs"),
        (Sampling(stop=[""]), "empty string"),
        (Sampling(min_tokens=5, max_tokens=3), "larger than max_tokens"),
    ],
)
def test_sampling_ranges(sampling: Sampling, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        render.check_sampling(sampling, max_logprobs=20)


def test_valid_sampling_passes() -> None:
    render.check_sampling(
        Sampling(temperature=0, top_p=1, top_k=-1, max_tokens=5, n=2, logprobs=True, top_logprobs=20),
        max_logprobs=20,
    )


def test_context_window_errors_say_by_how_much() -> None:
    with pytest.raises(InvalidArgument, match=r"the prompt is 9000 tokens.*shorten the prompt by 809 tokens"):
        render.check_context(9000, None, 8192)
    with pytest.raises(InvalidArgument, match="shorten the prompt by 1 tokens"):
        render.check_context(8192, None, 8192)
    with pytest.raises(InvalidArgument, match=r"at most 92 tokens can be generated \(8 too many\)"):
        render.check_context(8100, 100, 8192)
    assert render.check_context(100, None, 8192) == 8092
    assert render.check_context(100, 50, 8192) == 50


def test_tool_schemas_are_validated() -> None:
    with pytest.raises(InvalidArgument, match=r"tools\[0\]\.function\.parameters_json is not valid JSON"):
        render.tool_dicts([Tool("f", parameters_json="{")])
    with pytest.raises(InvalidArgument, match="not a valid JSON schema"):
        render.tool_dicts([Tool("f", parameters_json='{"type": "nonsense"}')])
    with pytest.raises(InvalidArgument, match="must be a JSON schema object"):
        render.tool_dicts([Tool("f", parameters_json="[1, 2]")])
    with pytest.raises(InvalidArgument, match="defined twice"):
        render.tool_dicts([Tool("f"), Tool("f")])
    with pytest.raises(InvalidArgument, match="name is empty"):
        render.tool_dicts([Tool("")])


def test_tool_choice() -> None:
    tools = [Tool("get_weather", parameters_json=SCHEMA)]
    assert render.tool_choice_value(ToolChoice(), []) is None
    assert render.tool_choice_value(ToolChoice(), tools) == "auto"
    assert render.tool_choice_value(ToolChoice(mode="none"), tools) == "none"
    assert render.tool_choice_value(ToolChoice(function="get_weather"), tools) == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    with pytest.raises(InvalidArgument, match="not in tools"):
        render.tool_choice_value(ToolChoice(function="nope"), tools)
    with pytest.raises(InvalidArgument, match="no tools are given"):
        render.tool_choice_value(ToolChoice(mode="required"), [])


def test_forced_calls_pin_the_argument_schema() -> None:
    tools = [Tool("get_weather", parameters_json=SCHEMA)]
    auto = render.chat_request_dict(
        GenerateRequest(messages=[Message("user", "hi")], tools=tools), "m", stream=False
    )
    assert "strict" not in auto["tools"][0]["function"]
    for choice in (ToolChoice(mode="required"), ToolChoice(function="get_weather")):
        request = GenerateRequest(messages=[Message("user", "hi")], tools=tools, tool_choice=choice)
        body = render.chat_request_dict(request, "m", stream=True)
        assert body["tools"][0]["function"]["strict"] is True
        assert body["stream"] is True


def test_chat_body_carries_sampling_and_leaves_max_tokens_to_the_engine() -> None:
    request = GenerateRequest(
        messages=[Message("system", "be brief"), Message("user", "hi", name="ann")],
        sampling=Sampling(
            temperature=0.5, max_tokens=7, stop=["x"], seed=3, logprobs=True, top_logprobs=2, n=2
        ),
        chat_template_kwargs={"enable_thinking": False},
        add_generation_prompt=False,
    )
    body = render.chat_request_dict(request, "m", stream=False)
    assert body["messages"][1] == {"role": "user", "content": "hi", "name": "ann"}
    assert body["temperature"] == 0.5 and body["seed"] == 3 and body["stop"] == ["x"] and body["n"] == 2
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert "max_completion_tokens" not in body and "max_tokens" not in body
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["add_generation_prompt"] is False
    assert "top_p" not in body  # unset: the engine's default


def test_completion_body_refuses_tools() -> None:
    with pytest.raises(InvalidArgument, match="tools need chat messages"):
        render.completion_request_dict(GenerateRequest(prompt="x", tools=[Tool("f")]), "m", stream=False)
    body = render.completion_request_dict(
        GenerateRequest(prompt="x", sampling=Sampling(logprobs=True, top_logprobs=3)), "m", stream=False
    )
    assert body["prompt"] == "x" and body["logprobs"] == 3 and body["max_tokens"] is None


def test_response_format() -> None:
    assert render.response_format_dict(ResponseFormat()) is None
    assert render.response_format_dict(ResponseFormat(type="json_object")) == {"type": "json_object"}
    fmt = render.response_format_dict(ResponseFormat(type="json_schema", name="p", schema_json=SCHEMA))
    assert fmt is not None and fmt["json_schema"]["name"] == "p"
    with pytest.raises(InvalidArgument, match="json_schema is empty"):
        render.response_format_dict(ResponseFormat(type="json_schema"))


def test_assistant_tool_calls_become_openai_messages() -> None:
    messages = [
        Message("assistant", "", tool_calls=[ToolCall("", "f", "")]),
        Message("tool", "1", tool_call_id="c"),
    ]
    out = render.message_dicts(messages)
    assert out[0]["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert out[1]["tool_call_id"] == "c"


def test_parse_json_object() -> None:
    assert render.parse_json_object("f", "") == {}
    assert render.parse_json_object("f", '{"a": 1}') == {"a": 1}
    with pytest.raises(InvalidArgument, match="f must be a JSON object"):
        render.parse_json_object("f", "[1]")
