"""Imports modules as if only some installed distributions were there (run in a subprocess).

``python -m tests.integration.deploy.importguard --allow grpcio --allow redis ... -- gateway``
installs a ``sys.meta_path`` finder that raises ``ModuleNotFoundError`` for every module that
only a distribution outside ``--allow`` provides (per the distributions' RECORD files), then
imports each named module and, for packages, everything under them. That is what a service
image with only its extra installed would do at import time; a fresh venv per extra would be
the real thing but needs a network and minutes. Prints the imported module names as JSON.

Standard library only: it must not itself import what it guards.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import pkgutil
import re
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType

_SKIPPED_DIRS = (".dist-info", ".egg-info", ".data")


def canonical(name: str) -> str:
    """A distribution name as PEP 503 normalizes it (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def module_of(parts: Sequence[str]) -> str | None:
    """The module a file installs (``torch/nn/__init__.py`` -> ``torch.nn``), or None."""
    if not parts or parts[0] == ".." or any(p.endswith(_SKIPPED_DIRS) for p in parts[:-1]):
        return None
    *dirs, filename = parts
    if filename.endswith(".py"):
        stem = filename[:-3]
    elif filename.endswith((".so", ".pyd")):
        stem = filename.split(".", 1)[0]  # _C.cpython-311-x86_64-linux-gnu.so
    else:
        return None
    names = dirs if stem == "__init__" else [*dirs, stem]
    if not names or not all(n.isidentifier() for n in names):
        return None
    return ".".join(names)


def blocked_modules(allowed: Iterable[str]) -> set[str]:
    """Modules that only distributions outside ``allowed`` (canonical names) install."""
    allowed = set(allowed)
    inside: set[str] = set()
    outside: set[str] = set()
    for dist in importlib.metadata.distributions():
        into = inside if canonical(dist.metadata["Name"] or "") in allowed else outside
        for path in dist.files or ():
            module = module_of(path.parts)
            if module:
                into.add(module)
    return outside - inside


class Guard(importlib.abc.MetaPathFinder):
    """Refuses the blocked modules the way a missing distribution would."""

    def __init__(self, blocked: set[str]) -> None:
        self.blocked = blocked

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in self.blocked:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (its distribution is not in this extra)", name=fullname
            )
        return None  # the other finders decide


def _raise(name: str) -> None:
    raise ImportError(f"cannot import {name} while walking its package")


def import_all(names: Iterable[str]) -> list[str]:
    """Imports each module and everything under each package; the names imported, in order."""
    done: list[str] = []
    for name in names:
        module = importlib.import_module(name)
        done.append(name)
        if hasattr(module, "__path__"):
            # walk_packages imports subpackages itself; onerror keeps it from skipping failures.
            for info in pkgutil.walk_packages(module.__path__, f"{name}.", onerror=_raise):
                importlib.import_module(info.name)
                done.append(info.name)
    return done


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="importguard")
    parser.add_argument("--allow", action="append", default=[], help="a distribution that is installed")
    parser.add_argument("modules", nargs="+")
    args = parser.parse_args(argv)
    guard = Guard(blocked_modules(canonical(n) for n in args.allow))
    before = set(sys.modules)
    sys.meta_path.insert(0, guard)
    imported = import_all(args.modules)
    # A module that reached sys.modules some other way than the finders would escape the guard.
    leaked = sorted(m for m in set(sys.modules) - before if m in guard.blocked)
    if leaked:
        print(f"blocked modules were imported anyway: {leaked}", file=sys.stderr)
        return 1
    print(json.dumps(imported))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
