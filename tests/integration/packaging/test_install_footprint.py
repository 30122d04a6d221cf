"""The install command adds no daemon besides Redis, and the test command none at all.

scripts/install.sh installs Debian packages only through ``apt_install``; every package it may
install is looked up in dpkg's file lists (they are installed on a machine the install ran
on): only redis-server may bring a systemd unit (one that is enabled at install, which the
script announces). The test command's promtool is unpacked, not installed: no package owns it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
INSTALL = ROOT / "scripts" / "install.sh"
TEST_SETUP = ROOT / "scripts" / "test-setup.sh"
# The one daemon the install may add, announced when it does (llmesh needs a Redis).
ALLOWED_DAEMONS = {"redis-server"}
UNIT_DIRS = ("/lib/systemd/system/", "/usr/lib/systemd/system/", "/etc/systemd/system/", "/etc/init.d/")

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg") is None, reason="not a Debian system")


def apt_packages(script: Path) -> set[str]:
    """Every package a script passes to ``apt_install`` / ``apt-get install``."""
    found: set[str] = set()
    for line in script.read_text().splitlines():
        code = line.split("#", 1)[0]
        m = re.search(r"\bapt_install\s+(.+)|apt-get install\s+(.+)", code)
        if m and not code.strip().startswith(("apt_install()", "$sudo")):
            words = (m.group(1) or m.group(2)).split()
            found |= {w for w in words if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w)}
    return found


def units_of(package: str) -> list[str]:
    listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        return []
    return [f for f in listed.stdout.splitlines() if f.startswith(UNIT_DIRS) and "." in Path(f).name]


def test_install_lists_only_what_serving_needs() -> None:
    packages = apt_packages(INSTALL)
    assert packages == {"redis-server", "libtcmalloc-minimal4"}, packages
    assert "systemd unit is enabled" in INSTALL.read_text(), "installing redis-server must be announced"


def test_test_setup_installs_no_server() -> None:
    packages = apt_packages(TEST_SETUP)
    assert packages <= {"nodejs", "npm"}, packages


@needs_dpkg
def test_no_installed_package_of_the_install_brings_a_daemon_besides_redis() -> None:
    for package in apt_packages(INSTALL) | apt_packages(TEST_SETUP):
        units = [u for u in units_of(package) if u.endswith((".service", ".socket", ".timer"))]
        if package not in ALLOWED_DAEMONS:
            assert not units, f"{package} brings {units}"


@needs_dpkg
def test_promtool_is_unpacked_not_installed() -> None:
    promtool = Path(sys.executable).with_name("promtool")
    assert promtool.exists(), "the test command's setup puts promtool in the virtualenv"
    owner = subprocess.run(["dpkg", "-S", str(promtool)], capture_output=True, text=True, check=False)
    assert owner.returncode != 0, owner.stdout
