"""The ``llmesh`` command: serve, up, smoke, bench, protos and the service subcommands."""

from __future__ import annotations

import argparse
import runpy
import signal
import sys

from services.runtime.build_info import build_info
from services.runtime.cli import catalog, doctor


class _Version(argparse.Action):
    """``--version``: the release and revision, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help"))
        )

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        print(f"llmesh {build_info().describe()}")
        parser.exit()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmesh", description="Self-hosted LLM serving mesh.")
    parser.add_argument("--version", action=_Version, help="print the release and source revision, then exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    services = [s.name for s in catalog.SERVICES]

    serve = sub.add_parser("serve", help="run one service in the foreground")
    serve.add_argument("service", choices=services)

    up = sub.add_parser("up", help="run every service on this machine until Ctrl-C (checks first: doctor)")
    doctor.add_plan_arguments(up)

    smoke = sub.add_parser("smoke", help="grpcurl checks (reflection, describe, health) of running services")
    smoke.add_argument("--address", action="append", default=[], help="host:port (repeatable)")
    smoke.add_argument("--timeout", type=float, default=10.0)

    bench = sub.add_parser(
        "bench", help="run a benchmark; prints a table, writes benchmarks/results/NAME.json"
    )
    bench.add_argument("name", choices=sorted(catalog.BENCHMARKS))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="options of that benchmark")

    protos = sub.add_parser("protos", help="build the gRPC stubs, or check that they are current")
    protos.add_argument("action", choices=["build", "check"])

    for name, (_module, help_text) in catalog.COMMANDS.items():
        extra = sub.add_parser(name, help=help_text, add_help=False)
        extra.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in catalog.COMMANDS:
        # A subcommand with a parser of its own gets every argument, --help included
        # (argparse's REMAINDER would leave a leading option to the top-level parser).
        module, _help = catalog.COMMANDS[argv[0]]
        return int(catalog.load(module, "cli")(argv[1:]))
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        spec = catalog.service(args.service)
        assert spec is not None
        runpy.run_module(f"{spec.package}.__main__", run_name="__main__", alter_sys=True)
        return 0
    if args.command == "up":
        from services.runtime.cli.up import run_up

        only = [s for s in args.only.split(",") if s]
        return run_up(
            replicas=args.inference_replicas,
            only=only,
            host=args.host,
            port_offset=args.port_offset,
            instances={
                "policy": args.policy_replicas,
                "cache": args.cache_replicas,
                "embeddings": args.embeddings_replicas,
            },
        )
    if args.command == "smoke":
        from services.runtime.cli.smoke import run_smoke

        return run_smoke(args.address, timeout=args.timeout)
    if args.command == "bench":
        # SIGTERM (timeout, kill) unwinds like Ctrl-C: the benchmark's finally blocks stop
        # the servers it started instead of leaving them orphaned.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            run = catalog.load_benchmark(args.name)
        except catalog.BenchmarksMissingError as exc:
            print(f"llmesh bench: {exc}", file=sys.stderr)
            return 2
        report = run(list(args.args))
        report.write()
        return 0
    if args.command == "protos":
        from llmesh import codegen

        return codegen.main(["--check"] if args.action == "check" else [])
    module, _help = catalog.COMMANDS[args.command]
    return int(catalog.load(module, "cli")(list(args.args)))


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
