from __future__ import annotations

import importlib.util

import pytest

from services.runtime.cli import catalog
from services.runtime.cli.main import main


def test_every_entry_names_a_module_in_the_tree() -> None:
    for spec in catalog.SERVICES:
        assert importlib.util.find_spec(f"{spec.package}.__main__") is not None, spec
        assert importlib.util.find_spec(f"{spec.package}.config") is not None, spec
    for name, module in catalog.BENCHMARKS.items():
        assert importlib.util.find_spec(module) is not None, name
    for name, (module, _help) in catalog.COMMANDS.items():
        assert callable(catalog.load(module, "cli")), name


def test_unknown_service_is_none() -> None:
    assert catalog.service("does-not-exist") is None
    assert catalog.service("cache") is not None


def test_protos_check_passes(capsys: object) -> None:
    assert main(["protos", "check"]) == 0


def test_a_subcommand_gets_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["certs", "--help"])
    assert exited.value.code == 0
    assert "llmesh certs" in capsys.readouterr().out
