"""benchmarks.harness.process_cpu_s: a process's CPU to the nanosecond, not to the clock tick."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.harness import process_cpu_s


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (the state first)."""
    return Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()


def _ticks_s(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_blocked(pid: int, timeout_s: float = 10.0) -> None:
    """Until the process sleeps (state S: blocked reading stdin); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while _stat(pid)[0] != "S":
        assert time.monotonic() < deadline, "the child never blocked"
        os.sched_yield()


def test_another_process_cpu_is_read_finer_than_a_clock_tick() -> None:
    # A child that burns CPU, says so, then waits to be read (stdin) while using none.
    child = subprocess.Popen(
        [sys.executable, "-c", "x = 0\nfor i in range(3_000_000): x += i\nprint(flush=True)\ninput()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "\n"
        _wait_blocked(child.pid)  # in input(), no longer on its way there
        first, ticks = process_cpu_s(child.pid), _ticks_s(child.pid)
        assert abs(first - ticks) <= 2 / os.sysconf("SC_CLK_TCK")  # the same clock, finer
        readings = {process_cpu_s(child.pid) for _ in range(3)}
        assert len(readings) == 1 and first in readings  # idle: no change
        assert first * 1e9 % (1e9 / os.sysconf("SC_CLK_TCK")) != 0  # not whole ticks
        assert process_cpu_s(os.getpid()) == pytest.approx(time.process_time(), abs=0.05)
    finally:
        child.communicate("\n")
    with pytest.raises(OSError):
        process_cpu_s(child.pid)  # reaped
