"""``llmesh bench faults``: kill -9 / restart and SIGSTOP of each service (and Redis) under load."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.harness import BenchReport
from benchmarks.reliability.scenarios import FaultsConfig, faults


def _names(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse(argv: list[str]) -> FaultsConfig:
    defaults = FaultsConfig()
    parser = argparse.ArgumentParser(prog="llmesh bench faults", description=__doc__)
    parser.add_argument("--replicas", type=int, default=defaults.replicas, help="inference replicas")
    parser.add_argument("--clients", type=int, default=defaults.clients, help="concurrent streaming clients")
    parser.add_argument(
        "--kill", type=_names, default=defaults.kills, help="comma-separated services (and redis)"
    )
    parser.add_argument("--pause", type=_names, default=defaults.pauses, help="comma-separated services")
    parser.add_argument(
        "--down", type=float, default=defaults.down_s, help="seconds a killed service stays down"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=defaults.request_timeout_s,
        help="gateway request deadline (s)",
    )
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and Redis data here")
    args = parser.parse_args(argv)
    return FaultsConfig(
        replicas=args.replicas,
        clients=args.clients,
        kills=args.kill,
        pauses=args.pause,
        down_s=args.down,
        request_timeout_s=args.request_timeout,
        max_tokens=args.max_tokens,
        workdir=args.workdir,
    )


def run(argv: list[str]) -> BenchReport:
    return asyncio.run(faults(parse(argv)))
