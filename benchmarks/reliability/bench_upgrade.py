"""``llmesh bench upgrade``: rolling restart of every service under load (SIGTERM, drain, same port)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.harness import BenchReport
from benchmarks.reliability.scenarios import UpgradeConfig, upgrade


def parse(argv: list[str]) -> UpgradeConfig:
    defaults = UpgradeConfig()
    parser = argparse.ArgumentParser(prog="llmesh bench upgrade", description=__doc__)
    parser.add_argument("--replicas", type=int, default=defaults.replicas, help="inference replicas")
    parser.add_argument("--clients", type=int, default=defaults.clients, help="concurrent streaming clients")
    parser.add_argument(
        "--order",
        default="",
        help="comma-separated services to restart, in order (default: all, start order)",
    )
    parser.add_argument(
        "--grace", type=float, default=defaults.grace_s, help="drain grace of every service (s)"
    )
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument(
        "--policy-instances", type=int, default=defaults.policy_instances, help="policy instances"
    )
    parser.add_argument(
        "--gateways", type=int, default=defaults.gateways, help="gateway instances behind the balancer"
    )
    parser.add_argument(
        "--settle", type=float, default=defaults.settle_s, help="load watched after a restart"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and Redis data here")
    args = parser.parse_args(argv)
    return UpgradeConfig(
        replicas=args.replicas,
        clients=args.clients,
        order=tuple(p.strip() for p in args.order.split(",") if p.strip()),
        grace_s=args.grace,
        max_tokens=args.max_tokens,
        policy_instances=args.policy_instances,
        gateways=args.gateways,
        settle_s=args.settle,
        workdir=args.workdir,
    )


def run(argv: list[str]) -> BenchReport:
    return asyncio.run(upgrade(parse(argv)))
