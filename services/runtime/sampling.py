"""The sampling fields a request may leave unset (``SamplingParams`` in ``common.proto``).

The gateway copies them from an OpenAI request only when given, and the inference
service passes them to vLLM only when set, so vLLM's own defaults apply otherwise.
"""

from __future__ import annotations

OPTIONAL_FIELDS: tuple[str, ...] = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
)
