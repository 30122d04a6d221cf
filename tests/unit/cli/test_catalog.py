from __future__ import annotations

from services.cli import catalog
from services.cli.main import main


def test_missing_modules_are_not_listed() -> None:
    assert not catalog.module_exists("services.does_not_exist.__main__")
    for spec in catalog.available_services():
        assert catalog.module_exists(f"{spec.package}.__main__")


def test_hops_benchmark_is_registered() -> None:
    assert "hops" in catalog.available_benchmarks()


def test_protos_check_passes(capsys: object) -> None:
    assert main(["protos", "check"]) == 0
