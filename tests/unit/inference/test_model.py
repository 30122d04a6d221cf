"""`llmesh model`: paths, idempotence, checksums (no download: a finished checkpoint is faked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.inference import model


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    return tmp_path


def fake_checkpoint(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / model.CHECKSUM_FILE).write_text(f"{model.checksum(folder)}  model.safetensors\n")


def test_default_model_dir_is_under_the_data_dir(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert model.default_model_dir() == data_dir / "models" / "smollm2-135m-instruct"
    assert model.cli(["path"]) == 0
    assert capsys.readouterr().out.strip() == str(data_dir / "models" / "smollm2-135m-instruct")


def test_prepare_is_idempotent(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_checkpoint(model.default_model_dir())
    assert model.cli(["prepare"]) == 0
    assert "already prepared" in capsys.readouterr().out
    assert (model.default_model_dir() / "model.safetensors").read_bytes() == b"weights"


def test_checksum_and_verify(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = model.default_model_dir()
    assert not model.is_prepared(folder)
    assert model.cli(["verify"]) == 1
    fake_checkpoint(folder)
    assert model.is_prepared(folder)
    assert model.read_checksum(folder) == model.checksum(folder)
    assert len(model.checksum(folder)) == 64
    assert model.cli(["verify"]) == 0
    (folder / "model.safetensors").write_bytes(b"tampered")
    assert model.cli(["verify"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_replace_swaps_in_a_new_checkpoint(tmp_path: Path) -> None:
    old = tmp_path / "model"
    old.mkdir()
    (old / "a").write_text("old")
    staged = tmp_path / "work" / "staged"
    staged.mkdir(parents=True)
    (staged / "a").write_text("new")
    model._replace(staged, old, tmp_path / "work")
    assert (old / "a").read_text() == "new"
    assert not (tmp_path / "work" / "previous").exists()
