"""Numbers beyond the proto field they travel in are a validation error (400), not a 500."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.api.chat.protocol import ChatCompletionRequest
from gateway.api.completions.protocol import CompletionRequest


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_tokens", 2**31), ("max_tokens", 2**31), ("top_k", 2**31), ("seed", 2**63), ("seed", -(2**63) - 1)],
)
def test_out_of_range_integers_are_rejected(field: str, value: int) -> None:
    with pytest.raises(ValidationError, match=field):
        CompletionRequest.model_validate({"model": "m", "prompt": "0", field: value})
    with pytest.raises(ValidationError, match=field):
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
        )


def test_largest_values_still_convert() -> None:
    request = CompletionRequest.model_validate(
        {"model": "m", "prompt": "0", "min_tokens": 2**31 - 1, "seed": 2**63 - 1, "max_tokens": 8}
    )
    sampling = request.sampling_pb(8, False, 0)
    assert sampling.min_tokens == 2**31 - 1 and sampling.seed == 2**63 - 1
