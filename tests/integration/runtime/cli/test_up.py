"""`llmesh up` starts services, `llmesh smoke` passes against them, SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.runtime.cli import catalog
from tests.fixtures.ports import free_port_offset
from tests.fixtures.processes import ROOT, ChildProcess

# Two light services on a busy machine: each is up within seconds, the bound is generous.
UP_TIMEOUT_S = 180.0
LIGHT = [s for s in ("cache", "policy") if catalog.service(s) is not None]


def _port_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, int(port))) == 0


@pytest.mark.skipif(not LIGHT, reason="needs the cache or policy service")
def test_up_smoke_and_stop(tmp_path: Path, redis_url: str) -> None:
    offset = free_port_offset(LIGHT)
    env = {"LLMESH_DATA_DIR": str(tmp_path), "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    up = ChildProcess(
        [sys.executable, "-m", "services.runtime.cli.main", "up", "--only", ",".join(LIGHT),
         "--port-offset", str(offset)],
        env=env,
    )  # fmt: skip
    try:
        up.wait_for(lambda line: True if "llmesh is up" in line else None, UP_TIMEOUT_S)
        table = up.output().splitlines()
        rows = {
            m.group(1): m.group(2)
            for m in (re.match(r"(\w+)\s+(\S+:\d+)\s+\d+\s+serving", t) for t in table)
            if m
        }
        assert set(rows) == set(LIGHT), "\n".join(table)
        smoke = subprocess.run(
            [sys.executable, "-m", "services.runtime.cli.main", "smoke"],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        for address in rows.values():
            assert address in smoke.stdout
        assert up.stop(60) == 0
        assert not (tmp_path / "run" / "up.json").exists()
        for address in rows.values():
            assert not _port_open(address)
    finally:
        up.close()
