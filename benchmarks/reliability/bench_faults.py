"""``llmesh bench faults``: kill -9 / restart and SIGSTOP of each service (and Redis) under load.

``--redis sentinel`` runs a replicated Redis (a primary, two replicas, three sentinels) and
``--kill redis`` then kills its primary (``redis-primary``); an empty list (``--pause ""``) runs
none of that kind of fault. ``--api-key``: the gateway has one configured key and the clients send
it, as in a deployment; without it the gateway runs open, and with its key-store snapshot stale
(Redis away) it refuses requests with 503 rather than serve them open."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.harness import BenchReport
from benchmarks.reliability.mesh import REDIS_MODES
from benchmarks.reliability.scenarios import FaultsConfig, faults


def _names(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse(argv: list[str]) -> FaultsConfig:
    defaults = FaultsConfig()
    parser = argparse.ArgumentParser(prog="llmesh bench faults", description=__doc__)
    parser.add_argument("--replicas", type=int, default=defaults.replicas, help="inference replicas")
    parser.add_argument("--clients", type=int, default=defaults.clients, help="concurrent streaming clients")
    parser.add_argument(
        "--kill",
        type=_names,
        default=defaults.kills,
        help="comma-separated services (and redis, or redis-primary with --redis sentinel)",
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
    parser.add_argument(
        "--redis",
        choices=REDIS_MODES,
        default=defaults.redis,
        help="one redis-server, or a primary with two replicas and three sentinels",
    )
    parser.add_argument(
        "--api-key",
        action="store_true",
        help="configure one API key in the gateway (as deploy/ does) and send it; default: run open",
    )
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
        redis=args.redis,
        api_key=args.api_key,
        workdir=args.workdir,
    )


def run(argv: list[str]) -> BenchReport:
    return asyncio.run(faults(parse(argv)))
