"""A redis-server of a test's own (the fault tests kill and restart it; never the shared one)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.fixtures.ports import free_port
from tests.fixtures.processes import ROOT, ChildProcess

START_TIMEOUT_S = 30.0
# The configuration the deployments give the responses Redis.
SHIPPED_CONF = ROOT / "deploy" / "redis" / "redis.conf"


def _ready(line: str) -> bool | None:
    return True if "Ready to accept connections" in line else None


class RedisProcess:
    """redis-server without persistence on a fixed loopback port; ready when it says so."""

    def __init__(
        self,
        port: int | None = None,
        *,
        extra_args: list[str] | None = None,
        directory: str | None = None,
        config: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        # A redis.conf read first (e.g. deploy/redis/redis.conf); the arguments below override it.
        self.config = config
        # A directory passed in belongs to the caller (close() leaves it alone).
        self._own_dir = directory is None
        self.dir = directory or tempfile.mkdtemp(prefix="llmesh-redis-")
        self.extra_args = list(extra_args or ())
        self.proc: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = ChildProcess(
            ["redis-server", *([str(self.config)] if self.config else []), "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--loglevel", "notice", *self.extra_args],
        )  # fmt: skip
        try:
            self.proc.wait_for(_ready, START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kills the server (no shutdown: what a crash looks like to its clients)."""
        if self.proc is not None:
            self.proc.close()
            self.proc = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
