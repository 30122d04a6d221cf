"""A redis-server of a test's own (the fault tests kill and restart it; never the shared one)."""

from __future__ import annotations

import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import IO

START_TIMEOUT_S = 30.0


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """redis-server without persistence on a fixed loopback port; ready when it says so."""

    def __init__(
        self,
        port: int | None = None,
        *,
        extra_args: list[str] | None = None,
        directory: str | None = None,
        config: str | None = None,
    ) -> None:
        self.port = port or free_port()
        # A redis.conf read first (e.g. deploy/redis/redis.conf); the arguments below override it.
        self.config = config
        # A directory passed in belongs to the caller (close() leaves it alone).
        self._own_dir = directory is None
        self.dir = directory or tempfile.mkdtemp(prefix="llmesh-redis-")
        self.extra_args = list(extra_args or ())
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", *([self.config] if self.config else []), "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--loglevel", "notice", *self.extra_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        # Lines are read on a thread for the process's whole life (a full pipe never blocks
        # it); the wait for readiness is bounded.
        lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=_pump, args=(self.proc.stdout, lines), daemon=True)
        self._reader.start()
        seen: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"redis-server exited with {self.proc.wait()}: {''.join(seen[-5:])}")
            seen.append(line)
            if "Ready to accept connections" in line:
                return
        self.stop()
        raise RuntimeError(f"redis-server not ready in {START_TIMEOUT_S:.0f} s: {''.join(seen[-5:])}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self._reader is not None:
                self._reader.join(timeout=5)
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            self.proc = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
