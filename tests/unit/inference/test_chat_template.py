"""The tool-aware ChatML template written into the prepared checkpoint."""

from __future__ import annotations

import json

import jinja2
import pytest

from services.inference.chat_template import CHATML_TOOLS_TEMPLATE

# SmolLM2-135M-Instruct's own template, as its GGUF ships it.
ORIGINAL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ENV = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
ENV.policies["json.dumps_kwargs"] = {"ensure_ascii": False}


def render(template: str, **kwargs: object) -> str:
    return ENV.from_string(template).render(**kwargs)


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_without_tools_it_renders_like_the_original(
    messages: list[dict[str, str]], add_generation_prompt: bool
) -> None:
    expected = render(ORIGINAL, messages=messages, add_generation_prompt=add_generation_prompt)
    assert (
        render(CHATML_TOOLS_TEMPLATE, messages=messages, add_generation_prompt=add_generation_prompt)
        == expected
    )


def test_tools_calls_and_results_use_the_hermes_format() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
    ]
    text = render(CHATML_TOOLS_TEMPLATE, messages=messages, tools=tools, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>' in text
    )
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
