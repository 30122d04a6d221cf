"""`llmesh doctor`'s engine checks: the model, tcmalloc, memory for the KV cache, CPU cores."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest

from services.runtime.cli.doctor import engine
from services.runtime.cli.doctor.install import engine_backend
from services.runtime.cli.doctor.report import GIB, Status, Target

CPU_ENGINE = engine_backend() == "cpu"


def test_an_unprepared_default_model_fails_with_model_prepare(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    result = engine.check_model(Target())
    assert result.status is Status.FAIL
    assert "the default model is not prepared" in result.detail and str(tmp_path) in result.detail
    assert result.fix.startswith("llmesh model prepare")


def test_a_half_prepared_default_model_fails_with_force(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from services.inference.model import default_model_dir

    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    default_model_dir().mkdir(parents=True)
    result = engine.check_model(Target())
    assert result.status is Status.FAIL
    assert result.fix == "llmesh model prepare --force"


def test_a_missing_model_directory_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    monkeypatch.setenv("LLMESH_INFERENCE_MODEL", str(missing))
    result = engine.check_model(Target())
    assert result.status is Status.FAIL
    assert result.detail == f"model directory {missing} does not exist"
    assert "LLMESH_INFERENCE_MODEL" in result.fix


def test_a_model_directory_is_checked_and_sized(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMESH_INFERENCE_MODEL", str(tmp_path))
    assert "has no config.json" in engine.check_model(Target()).detail
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert "has no weights" in engine.check_model(Target()).detail
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (1 << 20))
    result = engine.check_model(Target())
    assert result.status is Status.OK
    assert result.detail == f"{tmp_path}, 0.00 GiB of weights"


def test_a_hub_id_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMESH_INFERENCE_MODEL", "some-org/some-model")
    assert engine.check_model(Target()).status is Status.WARN


# -- tcmalloc, memory, cpu -------------------------------------------------------------------


def test_missing_tcmalloc_is_a_warning_with_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda _name: None)
    result = engine.check_tcmalloc(Target())
    assert result.status is Status.WARN
    assert "libtcmalloc-minimal4" in result.fix and "LLMESH_INFERENCE_MALLOC=system" in result.fix
    monkeypatch.setenv("LLMESH_INFERENCE_MALLOC", "system")
    assert engine.check_tcmalloc(Target()).status is Status.OK


@pytest.mark.skipif(not CPU_ENGINE, reason="the KV cache setting is the CPU engine's")
def test_a_kv_cache_larger_than_memory_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    available, _source = engine.available_memory()
    monkeypatch.setenv("LLMESH_INFERENCE_KV_CACHE_SPACE_GIB", str(available // GIB + 1))
    result = engine.check_memory(Target())
    assert result.status is Status.FAIL
    assert "LLMESH_INFERENCE_KV_CACHE_SPACE_GIB" in result.fix
    monkeypatch.setenv("LLMESH_INFERENCE_KV_CACHE_SPACE_GIB", "1")
    assert engine.check_memory(Target()).status is Status.OK


@pytest.mark.skipif(not CPU_ENGINE, reason="thread binding is the CPU engine's")
def test_binding_cores_outside_the_affinity_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = engine.allowed_cpus()
    monkeypatch.setenv("LLMESH_INFERENCE_OMP_THREADS_BIND", str(max(allowed) + 1))
    result = engine.check_cpu(Target())
    assert result.status is Status.FAIL
    assert f"binds cores {max(allowed) + 1}" in result.detail
    assert result.fix.startswith(f"LLMESH_INFERENCE_OMP_THREADS_BIND={engine.cpu_list(allowed)}")


@pytest.mark.skipif(not CPU_ENGINE, reason="thread binding is the CPU engine's")
def test_a_bad_binding_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMESH_INFERENCE_OMP_THREADS_BIND", "first-two")
    assert "is no core list" in engine.check_cpu(Target()).detail
    monkeypatch.setenv("LLMESH_INFERENCE_OMP_THREADS_BIND", "0|0")
    assert "2 core set(s)" in engine.check_cpu(Target()).detail


@pytest.mark.skipif(not CPU_ENGINE, reason="thread binding is the CPU engine's")
def test_replicas_on_the_same_cores_are_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMESH_INFERENCE_OMP_THREADS_BIND", str(min(engine.allowed_cpus())))
    assert engine.check_cpu(Target(replicas=1)).status is Status.OK
    assert engine.check_cpu(Target(replicas=2)).status is Status.WARN


def test_cpu_lists_round_trip() -> None:
    assert engine.parse_cpu_list("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert engine.cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    with pytest.raises(ValueError):
        engine.parse_cpu_list("3-1")
