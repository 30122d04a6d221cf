"""What runs: the llmesh release and the source revision it was built from.

The version is the installed distribution's (``pyproject.toml``). The revision comes from
``llmesh/_build.json``, which the wheel build writes (``setup.py``) when it runs in a git
checkout, or, for a checkout used in place (an editable install), from git itself. Each
service logs both when it starts, exports them as ``llmesh_build_info`` and the inference
service reports them in ``GetModelInfo``; ``llmesh --version`` prints them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Gauge

DISTRIBUTION = "llmesh"
# The source checkout, when this file sits in one (services/runtime/build_info.py).
_SOURCE_ROOT = Path(__file__).resolve().parents[2]

_BUILD_INFO = Gauge(
    "llmesh_build_info",
    "Always 1; the labels say which llmesh release and revision this process runs",
    ["service", "version", "revision", "python"],
)


@dataclass(frozen=True)
class BuildInfo:
    version: str
    # A git commit (12 hex digits, ``-dirty`` when the tree had changes), or "unknown".
    revision: str

    def describe(self) -> str:
        return f"{self.version} (revision {self.revision})"


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def git_revision(root: Path) -> str | None:
    """``git describe`` of a checkout at ``root`` (None when it is not one, or git is missing)."""
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12", "--exclude=*"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _recorded_revision() -> str | None:
    """The revision the wheel build recorded in ``llmesh/_build.json``."""
    try:
        import llmesh
    except ImportError:
        return None
    path = Path(llmesh.__file__).with_name("_build.json")
    try:
        revision = json.loads(path.read_text()).get("revision")
    except (OSError, ValueError, AttributeError):
        return None
    return revision if isinstance(revision, str) and revision else None


@functools.cache
def build_info() -> BuildInfo:
    revision = _recorded_revision() or git_revision(_SOURCE_ROOT) or "unknown"
    return BuildInfo(version=_version(), revision=revision)


def export(service: str) -> BuildInfo:
    """Sets ``llmesh_build_info{service=...}`` for this process and returns what it says."""
    info = build_info()
    _BUILD_INFO.labels(service, info.version, info.revision, platform.python_version()).set(1)
    return info
