"""``llmesh doctor``: checks what ``llmesh up`` needs, each failure with its fix.

Python and package versions (the pins in llmesh's installed metadata, core plus the extras
of the services started), the generated stubs (present, fresh, importable), the prepared
model and its size, Redis (reachable, version), free ports, tcmalloc, memory for the
configured KV cache and the CPU cores the engine's threads bind to. ``llmesh up`` runs the
same checks first (:func:`preflight`) and stops at the first failure, before it starts
anything.

No Redis answering is a warning, not a failure, when ``llmesh up`` would start one itself
(a loopback ``REDIS_URL`` and ``redis-server`` installed): ``up`` then works, but a service
started another way (``llmesh serve``) would not find Redis.

Every check is a function of a :class:`Target` (what ``up`` would start) returning a
:class:`Result` (``report.py``): ``install.py`` checks Python, the packages and the stubs,
``mesh.py`` Redis and the ports, ``engine.py`` the model, tcmalloc, memory and CPU cores.
Only :func:`cli` and :func:`preflight` print. Everything beyond the standard library is
imported inside the checks, so a missing package or missing stubs is reported by its check
instead of breaking the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from services.runtime.cli import catalog
from services.runtime.cli.catalog import MAX_INSTANCES, SCALABLE
from services.runtime.cli.doctor.engine import check_cpu, check_memory, check_model, check_tcmalloc
from services.runtime.cli.doctor.install import check_packages, check_python, check_stubs
from services.runtime.cli.doctor.mesh import check_ports, check_redis
from services.runtime.cli.doctor.report import Result, Status, Target

__all__ = ["CHECKS", "Check", "Result", "Status", "Target", "cli", "preflight", "run_checks"]


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Target], Result]
    # The services that need it; empty: every `llmesh up`.
    services: tuple[str, ...] = ()


CHECKS: tuple[Check, ...] = (
    Check("python", check_python),
    Check("packages", check_packages),
    Check("stubs", check_stubs),
    Check("redis", check_redis),
    Check("ports", check_ports),
    Check("model", check_model, ("inference",)),
    Check("tcmalloc", check_tcmalloc, ("inference",)),
    Check("memory", check_memory, ("inference",)),
    Check("cpu", check_cpu, ("inference",)),
)


def run_checks(target: Target) -> Iterator[Result]:
    """The results of the checks that apply to ``target``, in order, one at a time."""
    for check in CHECKS:
        if check.services and not set(check.services) & set(target.services):
            continue
        try:
            result = check.run(target)
        except Exception as exc:  # the check could not run: that is its finding
            result = Result(
                Status.FAIL,
                f"could not check: {type(exc).__name__}: {exc}",
                "fix what the message names (a failure above, e.g. packages, often explains it)",
            )
        yield dataclasses.replace(result, name=check.name)


def preflight(target: Target, out: IO[str] | None = None) -> bool:
    """``llmesh up``'s checks: warnings printed, False at the first failure (printed with its fix)."""
    stream = out or sys.stderr
    for result in run_checks(target):
        if result.status is Status.WARN:
            print(f"llmesh up: warning: {result.name}: {result.detail}", file=stream, flush=True)
        elif result.status is Status.FAIL:
            print(
                f"llmesh up: {result.name} check failed: {result.detail}\n  fix: {result.fix}\n"
                "  (llmesh doctor runs every check)",
                file=stream,
                flush=True,
            )
            return False
    return True


def _instance_count(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_INSTANCES:
        raise argparse.ArgumentTypeError(f"{value!r}: a number of instances from 1 to {MAX_INSTANCES}")
    return int(value)


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say what ``llmesh up`` starts (``up`` and ``doctor`` share them)."""
    parser.add_argument("--inference-replicas", type=_instance_count, default=1, metavar="N")
    parser.add_argument("--only", default="", help="comma-separated services to start (default: all)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port-offset", type=int, default=0, help="add N to every default port")
    for name in SCALABLE:
        parser.add_argument(
            f"--{name}-replicas",
            type=_instance_count,
            default=1,
            metavar="N",
            help=f"{name} instances (ports +100 each); the gateway balances over them",
        )


def target_of(args: argparse.Namespace) -> Target:
    return Target(
        only=tuple(s for s in args.only.split(",") if s),
        host=args.host,
        port_offset=args.port_offset,
        replicas=args.inference_replicas,
        instances={name: getattr(args, f"{name}_replicas") for name in SCALABLE},
    )


def render(results: list[Result]) -> str:
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for r in results:
        lines.append(
            f"{'ok' if r.status is Status.OK else r.status.value.upper():<5} {r.name:<{width}}  {r.detail}"
        )
        if r.fix and r.status is not Status.OK:
            lines.append(f"{'':<5} {'':<{width}}  fix: {r.fix}")
    count = {s: sum(r.status is s for r in results) for s in Status}
    lines.append(f"{count[Status.OK]} ok, {count[Status.WARN]} warnings, {count[Status.FAIL]} failures")
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    """``llmesh doctor [--only S,...] [--port-offset N] [--host H] [--json]``: exit 1 on a failure."""
    parser = argparse.ArgumentParser(
        prog="llmesh doctor", description="Check what `llmesh up` needs; print each problem with its fix."
    )
    add_plan_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = parser.parse_args(argv)
    target = target_of(args)
    unknown = set(target.only) - {s.name for s in catalog.SERVICES}
    if unknown:
        parser.error(f"unknown services: {', '.join(sorted(unknown))}")
    results = list(run_checks(target))
    failed = any(r.status is Status.FAIL for r in results)
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [r.as_dict() for r in results]}, indent=2))
    else:
        print(render(results))
    return 1 if failed else 0
