"""`llmesh protos build` must run before any stub exists (a fresh clone's install runs it)."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.processes import ROOT

# Refuses every generated module, as on a fresh clone before `llmesh protos build`.
_NO_STUBS = """
import importlib.abc, sys

class NoStubs(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("llmesh.v1.") and name.endswith(("_pb2", "_pb2_grpc")):
            raise ModuleNotFoundError(f"no generated stub {name}")
        return None

sys.meta_path.insert(0, NoStubs())
from services.runtime.cli.main import _build_parser
args = _build_parser().parse_args(["protos", "check"])
assert args.action == "check"
"""


def test_the_cli_parses_protos_without_any_generated_stub() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_STUBS], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
