"""Verdicts over process samples: RSS growth after warm-up and idle leaks."""

from __future__ import annotations

import math

from benchmarks.reliability.probes import Sample, growth, leak, parse_gauge


def _sample(t: float, rss: float, pid: int = 1, tasks: int | None = 10, tcp: int = 3) -> Sample:
    return Sample(t, "svc", pid, rss, rss, 20, 20, 4, tcp, tcp, tasks)


def test_growth_ignores_the_warmup() -> None:
    series = [
        _sample(0, 50),
        _sample(10, 90),
        *(_sample(t, 100) for t in range(20, 60, 10)),
        _sample(60, 104),
    ]
    assert math.isclose(growth(series, warmup_s=20, attr="rss_mb", window=1), 0.04)


def test_growth_follows_the_last_process_only() -> None:
    series = [_sample(30, 500, pid=1), _sample(40, 100, pid=2), _sample(50, 110, pid=2)]
    assert math.isclose(growth(series, warmup_s=0, attr="rss_mb", window=1), 0.10)


def test_growth_needs_two_samples() -> None:
    assert math.isnan(growth([_sample(30, 100)], warmup_s=0))


def test_leak_compares_the_same_process() -> None:
    assert leak(_sample(0, 1, tasks=10), _sample(9, 1, tasks=13), "tasks") == 3
    assert leak(_sample(0, 1, tcp=5), _sample(9, 1, tcp=5), "tcp") == 0
    assert leak(_sample(0, 1, pid=1), _sample(9, 1, pid=2), "tasks") is None
    assert leak(_sample(0, 1, tasks=None), _sample(9, 1), "tasks") is None


def test_parse_gauge() -> None:
    text = "# HELP llmesh_asyncio_tasks x\n# TYPE llmesh_asyncio_tasks gauge\nllmesh_asyncio_tasks 17.0\n"
    assert parse_gauge(text, "llmesh_asyncio_tasks") == 17
    assert parse_gauge("other 1.0\n", "llmesh_asyncio_tasks") is None
