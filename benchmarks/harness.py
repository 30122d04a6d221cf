"""The small framework every ``llmesh bench NAME`` plugs into.

A benchmark module exposes ``run(argv: list[str]) -> BenchReport``; the CLI calls
``report.write()``, which prints a table and writes
``benchmarks/results/<name>.json`` with the machine it ran on.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(os.environ.get("LLMESH_BENCH_RESULTS", "benchmarks/results"))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean of samples given in seconds, in milliseconds."""
    ms = [s * 1000.0 for s in samples_s]
    return {
        "p50_ms": round(percentile(ms, 50), 4),
        "p90_ms": round(percentile(ms, 90), 4),
        "p99_ms": round(percentile(ms, 99), 4),
        "mean_ms": round(statistics.fmean(ms), 4) if ms else float("nan"),
        "n": len(ms),
    }


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            mem_gib = round(int(fh.readline().split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False, timeout=5
        ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_commit": commit or None,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@dataclass
class BenchReport:
    """Rows of a results table, the headline figures and free-text notes."""

    name: str
    rows: list[dict[str, Any]]
    headline: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        if not self.rows:
            return "(no rows)"
        columns: list[str] = []
        for row in self.rows:
            columns.extend(k for k in row if k not in columns)
        cells = [[_fmt(row.get(c, "")) for c in columns] for row in self.rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
        lines.append("-|-".join("-" * w for w in widths))
        lines.extend(" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "machine": machine_info(),
            "headline": self.headline,
            "rows": self.rows,
            "notes": self.notes,
        }

    def write(self, results_dir: Path | None = None) -> Path:
        """Prints the table and headline; writes the JSON file and returns its path."""
        out_dir = results_dir or RESULTS_DIR
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{self.name}.json"
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
        print(f"# llmesh bench {self.name}")
        print(self.table())
        print()
        for key, value in self.headline.items():
            print(f"{key}: {_fmt(value)}")
        for note in self.notes:
            print(f"note: {note}")
        print(f"wrote {path}")
        return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process has used, its exited threads included: Linux's CPU clock of the
    process (nanoseconds, what clock_getcpuclockid(3) gives), else /proc's user + system time
    (whole clock ticks, 10 ms: a phase of ~100 ms of a process's CPU would be read to ±10 %).
    OSError once the process is gone."""
    try:
        # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of the kernel's posix-cpu-timers.
        return time.clock_gettime_ns((~pid << 3) | 2) / 1e9
    except OSError:
        if not Path(f"/proc/{pid}").exists():
            raise
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
