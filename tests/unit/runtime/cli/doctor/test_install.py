"""`llmesh doctor`'s installation checks: Python, the pinned packages, the stubs."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from llmesh import codegen

from services.runtime.cli.doctor import install
from services.runtime.cli.doctor.report import Status, Target
from tests.fixtures.processes import ROOT


def test_an_old_python_fails_with_the_version_needed() -> None:
    result = install.python_result((3, 10, 12), ">=3.11")
    assert result.status is Status.FAIL
    assert "Python 3.10.12" in result.detail and ">=3.11" in result.detail
    assert "scripts/install.sh" in result.fix
    assert install.python_result((3, 11, 0), ">=3.11").status is Status.OK


def test_a_missing_or_mismatched_package_is_named() -> None:
    requires = [
        "redis==0.0.1",  # installed (core), another version
        "llmesh-doctor-absent==1.0",
        'llmesh-doctor-absent-extra==1.0; extra == "gateway"',
        'llmesh-doctor-other-extra==1.0; extra == "policy"',
    ]
    problems = install.package_problems(requires, {"gateway"}, install.installed_version)
    assert problems == [
        f"redis {install.installed_version('redis')} installed, 0.0.1 pinned",
        "llmesh-doctor-absent: missing",
        "llmesh-doctor-absent-extra: missing",
    ]


def test_a_local_version_label_matches_its_pin() -> None:
    assert install.package_problems(["torch==2.13.0"], set(), lambda _name: "2.13.0+cpu") == []
    assert install.package_problems(["numpy==2.3"], set(), lambda _name: "2.3.0") == []


def test_check_packages_fails_with_the_extras_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "requires", lambda _name: ['faiss-absent==1.0; extra == "cache"'])
    result = install.check_packages(Target(only=("cache", "policy")))
    assert result.status is Status.FAIL
    assert result.detail == "faiss-absent: missing"
    assert "pip install 'llmesh[cache,policy]'" in result.fix


def test_the_installed_pins_pass() -> None:
    result = install.check_packages(Target(only=("policy",)))
    assert result.status is Status.OK, result


# -- stubs ----------------------------------------------------------------------------------


@pytest.fixture
def stub_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the contracts with freshly generated stubs, in place of the package's."""
    package = tmp_path / "llmesh" / "v1"
    package.mkdir(parents=True)
    for proto in codegen.proto_files():
        shutil.copy(proto, package / proto.name)
    monkeypatch.setattr(codegen, "PROTO_ROOT", tmp_path)
    monkeypatch.setattr(codegen, "PACKAGE_DIR", package)
    codegen.generate(tmp_path)
    return package


def test_fresh_stubs_pass(stub_dir: Path) -> None:
    result = install.check_stubs(Target())
    assert result.status is Status.OK, result
    assert str(stub_dir) in result.detail


def test_deleted_stubs_fail_with_protos_build(stub_dir: Path) -> None:
    (stub_dir / "chat_pb2_grpc.py").unlink()
    result = install.check_stubs(Target())
    assert result.status is Status.FAIL
    assert result.detail == f"stubs missing in {stub_dir}: chat_pb2_grpc.py"
    assert result.fix == "llmesh protos build"


def test_stale_stubs_fail_with_protos_build(stub_dir: Path) -> None:
    with (stub_dir / "policy_pb2.py").open("a", encoding="utf-8") as fh:
        fh.write("# edited by hand\n")
    result = install.check_stubs(Target())
    assert result.status is Status.FAIL
    assert result.detail == "stubs out of date with the .proto files: policy_pb2.py"
    assert result.fix == "llmesh protos build"


# Refuses every generated module, as when the stubs do not import (protobuf runtime too old).
_NO_STUBS = """
import importlib.abc, sys

class NoStubs(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("llmesh.v1.") and name.endswith(("_pb2", "_pb2_grpc")):
            raise ModuleNotFoundError(f"no generated stub {name}")
        return None

sys.meta_path.insert(0, NoStubs())
from llmesh import codegen
codegen.stale_stubs = lambda: []  # the files are not what this test is about
from services.runtime.cli.doctor import install, report
result = install.check_stubs(report.Target())
print(result.status.value, result.detail, "|", result.fix)
"""


def test_stubs_that_do_not_import_fail_and_doctor_still_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_STUBS], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fail llmesh.v1.cache_pb2_grpc does not import: no generated stub")
    assert done.stdout.strip().endswith("| llmesh protos build")
