"""The chat template written into the prepared SmolLM2 checkpoint.

SmolLM2-135M-Instruct ships a plain ChatML template that ignores tool definitions.
This one renders system, user and assistant messages exactly like the original
(including its default system prompt) and adds Hermes-style tool use on top:
tool signatures inside ``<tools></tools>`` in the system turn, calls as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (what vLLM's ``hermes``
tool parser reads back) and tool results as ``<tool_response>`` user turns.
"""

from __future__ import annotations

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CHATML_TOOLS_TEMPLATE = (
    "{%- set default_system = '" + DEFAULT_SYSTEM_PROMPT + "' -%}\n"
    """{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set system_text = messages[0]['content'] or '' -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system_text = default_system -%}
    {%- set rest = messages -%}
{%- endif -%}
{%- if tools -%}
    {%- set system_text = system_text ~ '\\n\\n# Tools\\n\\nYou may call one or more functions \
to assist with the user query.\\n\\nYou are provided with function signatures within \
<tools></tools> XML tags:\\n<tools>' -%}
    {%- set ns = namespace(text=system_text) -%}
    {%- for tool in tools -%}
        {%- set ns.text = ns.text ~ '\\n' ~ (tool | tojson) -%}
    {%- endfor -%}
    {%- set system_text = ns.text ~ '\\n</tools>\\n\\nFor each function call, return a json object with \
function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": \
<function-name>, "arguments": <args-json-object>}\\n</tool_call>' -%}
{%- endif -%}
{{- '<|im_start|>system\\n' ~ system_text ~ '<|im_end|>\\n' -}}
{%- for message in rest -%}
    {%- if message['role'] == 'tool' -%}
        {{- '<|im_start|>user\\n<tool_response>\\n' ~ (message['content'] or '') ~ \
'\\n</tool_response><|im_end|>\\n' -}}
    {%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}
        {{- '<|im_start|>assistant\\n' ~ (message['content'] or '') -}}
        {%- for call in message['tool_calls'] -%}
            {%- set fn = call['function'] if call.get('function') else call -%}
            {%- set args = fn['arguments'] -%}
            {%- if args is string -%}{%- set args_json = args -%}
            {%- else -%}{%- set args_json = args | tojson -%}{%- endif -%}
            {{- '\\n<tool_call>\\n{"name": "' ~ fn['name'] ~ '", "arguments": ' ~ args_json \
~ '}\\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\\n' -}}
    {%- else -%}
        {{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ (message['content'] or '') ~ '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""
)
