"""Engine error mapping, model resolution and the dead-engine watchdog, over fakes of vLLM's objects."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from services.inference import app as inference_app
from services.inference import engine as engine_module
from services.inference.config import InferenceSettings
from services.inference.engine import VllmEngine, preload_tcmalloc
from services.inference.model import CHECKSUM_FILE, model_revision
from services.inference.types import GenerateRequest, Message
from services.runtime.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable


class QueueOverflowError(Exception):
    """Stands in for vLLM's (importing vLLM in a unit test would pull in torch)."""


class VLLMValidationError(Exception):
    pass


class EngineDeadError(Exception):
    pass


@pytest.fixture(autouse=True)
def fake_vllm_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        engine_module, "vllm_error_types", lambda: (QueueOverflowError, VLLMValidationError, EngineDeadError)
    )


class FakeLLM:
    def __init__(self, *, errored: bool = False) -> None:
        self.errored = errored
        self.renderer = SimpleNamespace(get_tokenizer=object)
        self.model_config = SimpleNamespace(get_diff_sampling_param=dict, max_model_len=8192)

    def get_num_unfinished_requests(self) -> int:
        return 48

    async def check_health(self) -> None:
        if self.errored:
            raise EngineDeadError()


def make_engine(llm: Any = None, **settings: Any) -> VllmEngine:
    return VllmEngine(InferenceSettings(**settings), llm or FakeLLM(), SimpleNamespace(parser=None), "rev")


def test_admission_rejection_is_resource_exhausted() -> None:
    error = make_engine(max_num_seqs=16, max_waiting_requests=32)._engine_error(QueueOverflowError())
    assert isinstance(error, ResourceExhausted)
    assert "48 requests running or waiting" in error.message
    assert "max_num_seqs 16 + max_waiting_requests 32" in error.message
    assert error.retry_after_s == 1.0


def test_dead_engine_is_unavailable_and_reported() -> None:
    engine = make_engine()
    calls: list[bool] = []
    engine.on_dead = lambda: calls.append(True)
    error = engine._engine_error(EngineDeadError())
    assert isinstance(error, Unavailable)
    assert calls == [True]


def test_validation_errors_are_invalid_argument() -> None:
    error = make_engine()._engine_error(VLLMValidationError("top_k too large"))
    assert isinstance(error, InvalidArgument) and "top_k too large" in error.message
    other = RuntimeError("boom")
    assert make_engine()._engine_error(other) is other


async def test_unknown_model_is_not_found_and_aliases_resolve() -> None:
    engine = make_engine(aliases=["small"])
    engine._resolve("")
    engine._resolve("small")
    engine._resolve("smollm2-135m-instruct")
    with pytest.raises(NotFound, match=r"model 'gpt-17' is not served here \(served: small, smollm2"):
        await engine.generate(GenerateRequest(model="gpt-17", messages=[Message("user", "hi")]))


async def test_requests_to_a_dead_engine_are_unavailable() -> None:
    engine = make_engine(FakeLLM(errored=True))
    with pytest.raises(Unavailable, match="died"):
        await engine.generate(GenerateRequest(messages=[Message("user", "hi")]))
    assert await engine.check_health() is False
    assert await make_engine().check_health() is True


async def test_watchdog_marks_not_serving_when_the_engine_dies() -> None:
    states: list[bool] = []

    class Running:
        async def set_serving(self, serving: bool) -> None:
            states.append(serving)

    await inference_app.watch(make_engine(FakeLLM(errored=True)), Running(), 0.01)  # type: ignore[arg-type]
    assert states == [False]


def test_model_revision(tmp_path: Any) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"123")
    derived = model_revision(str(tmp_path))
    assert derived.startswith("files-") and derived == model_revision(str(tmp_path))
    (tmp_path / CHECKSUM_FILE).write_text("abc123  model.safetensors\n")
    assert model_revision(str(tmp_path)) == "abc123"
    assert model_revision("org/some-model") == "org/some-model"


def test_tcmalloc_is_preloaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    found = preload_tcmalloc()
    if found is None:
        pytest.fail("tcmalloc is not installed (scripts/install.sh installs libtcmalloc-minimal4)")
    assert os.environ["LD_PRELOAD"] == f"{found}:/opt/other.so"
    assert preload_tcmalloc() == found  # already there: left as it is
    assert os.environ["LD_PRELOAD"].count("tcmalloc") == 1


@pytest.mark.parametrize("value", ["0.5", "0", "-1"])
def test_a_kv_cache_size_that_is_not_a_whole_positive_gib_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer: "0.5" would stop the engine at start.
    monkeypatch.setenv("LLMESH_INFERENCE_KV_CACHE_SPACE_GIB", value)
    with pytest.raises(ValueError, match="kv_cache_space_gib"):
        InferenceSettings()
    monkeypatch.setenv("LLMESH_INFERENCE_KV_CACHE_SPACE_GIB", "2")
    assert InferenceSettings().kv_cache_space_gib == 2
