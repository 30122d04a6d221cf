"""The engine's dtype: a setting other than auto is taken as it is."""

from __future__ import annotations

import pytest

from services.inference.config import InferenceSettings
from services.inference.engine import cpu_has_native_bf16, engine_dtype


@pytest.mark.parametrize("dtype", ["half", "float16", "bfloat16", "float", "float32"])
def test_an_explicit_dtype_is_kept(dtype: str) -> None:
    assert engine_dtype(InferenceSettings(dtype=dtype)) == dtype  # type: ignore[arg-type]


def test_auto_on_this_cpu_is_bf16_only_where_the_cpu_has_it() -> None:
    assert engine_dtype(InferenceSettings()) == ("auto" if cpu_has_native_bf16() else "float32")
