"""Buf on the contracts: the standard lint rules hold, the tree is compatible with the
recorded baseline, and ``buf breaking`` does catch a removed or renumbered field (so the
check in scripts/test.sh can fail)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.tools import tool

ROOT = Path(__file__).resolve().parents[3]
PROTOS = ROOT / "protos"
BASELINE = PROTOS / "baseline" / "llmesh-v1.json"


def run_buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("buf"), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def copy_protos(tmp_path: Path) -> Path:
    copy = tmp_path / "protos"
    shutil.copytree(PROTOS, copy, ignore=shutil.ignore_patterns("*.py", "*.pyi", "baseline", "__pycache__"))
    return copy


def test_lint_and_breaking_pass_on_the_tree() -> None:
    lint = run_buf("lint", "protos")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    breaking = run_buf("breaking", "protos", "--against", str(BASELINE))
    assert breaking.returncode == 0, breaking.stdout + breaking.stderr


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # A field removed without `reserved`: CompleteRequest.session_id (number 7).
        (lambda s: s.replace("  string session_id = 7;\n", "", 1), r'Previously present field "7"'),
        # A field renumbered: RagOptions.top_k from 2 to 12.
        (lambda s: s.replace("int32 top_k = 2;", "int32 top_k = 12;", 1), r'field "2"'),
    ],
    ids=["removed", "renumbered"],
)
def test_breaking_catches_a_changed_field(tmp_path: Path, edit: object, expected: str) -> None:
    copy = copy_protos(tmp_path)
    chat = copy / "llmesh" / "v1" / "chat.proto"
    before = chat.read_text()
    after = edit(before)  # type: ignore[operator]
    assert after != before, "the edit no longer applies to chat.proto: update this test"
    chat.write_text(after)
    result = run_buf("breaking", str(copy), "--against", str(BASELINE))
    assert result.returncode != 0, "buf breaking accepted a breaking change"
    assert re.search(expected, result.stdout + result.stderr), result.stdout + result.stderr


def test_lint_catches_a_badly_named_rpc_request(tmp_path: Path) -> None:
    copy = copy_protos(tmp_path)
    chat = copy / "llmesh" / "v1" / "chat.proto"
    text = chat.read_text()
    chat.write_text(
        text.replace("rpc CompleteStream(CompleteStreamRequest)", "rpc CompleteStream(CompleteRequest)")
    )
    result = run_buf("lint", str(copy))
    assert result.returncode != 0
    assert "CompleteRequest" in result.stdout + result.stderr
