"""An earlier build of llmesh, unpacked beside this one, so a benchmark runs both in one run.

``git archive`` of the revision goes into ``<root>/llmesh-<commit>``; its contract stubs are
generated with its own ``llmesh.codegen`` and the current virtualenv. Its services then run as
``python -m <module>`` from that directory with it first on ``PYTHONPATH`` (before this
checkout's editable install), with the same settings as today's: a revision whose settings or
dependencies differ too much fails to start, and the benchmark says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Baseline:
    commit: str
    tree: Path

    @property
    def env(self) -> dict[str, str]:
        """What a child process of this build needs in its environment."""
        return {"PYTHONPATH": f"{self.tree}{os.pathsep}{self.tree / 'protos'}"}


def unpack(revision: str, root: Path) -> Baseline:
    """The project at ``revision`` under ``root`` with its stubs generated (reused when present)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short=7", f"{revision}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = root / f"llmesh-{commit}"
    baseline = Baseline(commit, tree)
    if (tree / ".unpacked").exists():
        return baseline
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=REPO, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    subprocess.run(
        [sys.executable, "-m", "llmesh.codegen"],
        cwd=tree,
        env={**os.environ, **baseline.env},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (tree / ".unpacked").touch()
    return baseline
