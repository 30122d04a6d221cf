"""Builds the Python stubs of the llmesh contracts with grpcio-tools.

The ``.proto`` files live in ``protos/llmesh/v1/`` (folder path == package
``llmesh.v1``), and the stubs are written beside them, so the generated
``from llmesh.v1 import common_pb2`` imports work without patching.

Besides the messages (``_pb2.py`` and its ``_pb2.pyi``) and the gRPC classes
(``_pb2_grpc.py``), mypy-protobuf's gRPC plugin writes ``_pb2_grpc.pyi``: typed
stubs whose methods take and return the RPC's own messages (``XStub(channel)`` on a
``grpc.aio.Channel`` is typed as ``XAsyncStub``), so mypy checks every call between
services.

``python -m llmesh.codegen`` writes the stubs; ``--check`` regenerates them in a
temporary folder and exits 1 if the ones in place differ (stale or missing).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = PROTO_ROOT / "llmesh" / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
# mypy-protobuf's protoc plugin for the typed gRPC stubs (the ``_pb2_grpc.pyi`` files).
GRPC_STUB_PLUGIN = "protoc-gen-mypy_grpc"


def proto_files() -> list[Path]:
    """The contract files, sorted."""
    return sorted(PACKAGE_DIR.glob("*.proto"))


def grpc_stub_plugin() -> Path:
    """The mypy-protobuf gRPC plugin installed beside this interpreter (or on ``PATH``)."""
    # The console script sits next to the interpreter in a virtualenv, which need not be on PATH.
    here = Path(sys.executable).parent
    found = shutil.which(GRPC_STUB_PLUGIN, path=str(here)) or shutil.which(GRPC_STUB_PLUGIN)
    if found is None:
        raise RuntimeError(f"{GRPC_STUB_PLUGIN} not found: install mypy-protobuf (a dependency of llmesh)")
    return Path(found)


def generate(out_root: Path) -> list[Path]:
    """Runs protoc on every contract, writing stubs under ``out_root/llmesh/v1``."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    (out_root / "llmesh" / "v1").mkdir(parents=True, exist_ok=True)
    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin={GRPC_STUB_PLUGIN}={grpc_stub_plugin()}",
        f"--mypy_grpc_out={out_root}",
        # Sync and async stubs both: the mesh calls over grpc.aio, probes and tests also over grpc.
        "--mypy_grpc_opt=quiet",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(files))
    return expected_outputs(out_root)


def expected_outputs(root: Path) -> list[Path]:
    """The stub files protoc writes for the current contracts under ``root``."""
    return [
        root / "llmesh" / "v1" / f"{proto.stem}{suffix}" for proto in proto_files() for suffix in SUFFIXES
    ]


def stale_stubs() -> list[str]:
    """Names of the stubs in place that differ from freshly generated ones (or are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for new in fresh:
            current = PACKAGE_DIR / new.name
            if not current.exists() or not filecmp.cmp(current, new, shallow=False):
                stale.append(new.name)
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmesh.codegen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_stubs()
        if stale:
            print("stale or missing stubs: " + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    written = generate(PROTO_ROOT)
    print(f"wrote {len(written)} stub files under {PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
