"""``llmesh bench soak``: a mesh under steady streaming load; failures, memory, leaks over time."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.harness import BenchReport
from benchmarks.reliability.mesh import REDIS_MODES
from benchmarks.reliability.scenarios import SoakConfig, soak


def parse(argv: list[str]) -> SoakConfig:
    parser = argparse.ArgumentParser(prog="llmesh bench soak", description=__doc__)
    parser.add_argument("--replicas", type=int, default=2, help="inference replicas")
    parser.add_argument("--clients", type=int, default=50, help="concurrent streaming clients")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before RSS growth is measured")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-requests", type=int, default=None, help="stop after this many requests")
    parser.add_argument(
        "--redis",
        choices=REDIS_MODES,
        default="single",
        help="one redis-server, or a primary with two replicas and three sentinels",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and Redis data here")
    args = parser.parse_args(argv)
    return SoakConfig(
        replicas=args.replicas,
        clients=args.clients,
        duration_s=args.duration,
        warmup_s=args.warmup,
        interval_s=args.interval,
        max_tokens=args.max_tokens,
        max_requests=args.max_requests,
        redis=args.redis,
        workdir=args.workdir,
    )


def run(argv: list[str]) -> BenchReport:
    return asyncio.run(soak(parse(argv)))
