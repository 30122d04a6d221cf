"""What runs: the release, the revision (recorded by the wheel build or read from git) and the
``llmesh_build_info`` metric each service exports."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

from prometheus_client import REGISTRY

from services.runtime import build_info as bi

ROOT = Path(__file__).resolve().parents[3]


def test_version_is_the_distribution_and_revision_is_git_in_a_checkout() -> None:
    info = bi.build_info()
    assert info.version == importlib.metadata.version("llmesh")
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    assert info.revision.removesuffix("-dirty") == head.stdout.strip()[:12]
    assert info.describe() == f"{info.version} (revision {info.revision})"


def test_git_revision_outside_a_checkout_is_none(tmp_path: Path) -> None:
    assert bi.git_revision(tmp_path) is None


def test_export_sets_the_metric() -> None:
    info = bi.export("unit-test")
    value = REGISTRY.get_sample_value(
        "llmesh_build_info",
        {"service": "unit-test", "version": info.version, "revision": info.revision, "python": _python()},
    )
    assert value == 1.0


def _python() -> str:
    import platform

    return platform.python_version()
