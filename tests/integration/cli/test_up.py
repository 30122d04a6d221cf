"""`llmesh up` starts services, `llmesh smoke` passes against them, SIGTERM stops them all."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.runtime.cli import catalog

ROOT = Path(__file__).resolve().parents[3]
LIGHT = [s for s in ("cache", "policy") if catalog.service(s) is not None]


def _port_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, int(port))) == 0


@pytest.mark.skipif(not LIGHT, reason="needs the cache or policy service")
def test_up_smoke_and_stop(tmp_path: Path, redis_url: str) -> None:
    offset = random.randrange(2000, 9000, 10)
    env = dict(os.environ, LLMESH_DATA_DIR=str(tmp_path), REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.runtime.cli.main",
            "up",
            "--only",
            ",".join(LIGHT),
            "--port-offset",
            str(offset),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert up.stdout is not None
    table: list[str] = []
    try:
        for line in up.stdout:
            table.append(line)
            if "llmesh is up" in line:
                break
        else:
            pytest.fail("llmesh up exited before it was up:\n" + "".join(table))
        rows = {
            m.group(1): m.group(2)
            for m in (re.match(r"(\w+)\s+(\S+:\d+)\s+\d+\s+serving", t) for t in table)
            if m
        }
        assert set(rows) == set(LIGHT), "".join(table)
        smoke = subprocess.run(
            [sys.executable, "-m", "services.runtime.cli.main", "smoke"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        for address in rows.values():
            assert address in smoke.stdout
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        assert not (tmp_path / "run" / "up.json").exists()
        for address in rows.values():
            assert not _port_open(address)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        up.stdout.close()
