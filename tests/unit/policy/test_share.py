from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policy.config import DEFAULT_RULESET
from policy.service import PolicyService
from policy.store import RulesetStore
from services.runtime import context as rc
from services.runtime.errors import Unavailable
from tests.fixtures.context import activated
from tests.unit.policy.fakes import FakeAudit, FakeShare, FakeTenants, FakeVersions, small_ruleset

SMALL = small_ruleset("shared")


@pytest.fixture
def admin() -> Iterator[rc.RequestContext]:
    ctx = rc.new_context(tenant="default")
    with activated(ctx):
        yield ctx


def replica(path: Path, share: FakeShare, versions: FakeVersions) -> PolicyService:
    return PolicyService(RulesetStore(path), FakeAudit(), versions, FakeTenants(), share=share)


@pytest.fixture
def ruleset_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_bytes(DEFAULT_RULESET.read_bytes())
    return path


async def test_a_reload_reaches_every_replica_and_the_file_brings_them_back(
    ruleset_file: Path, admin: rc.RequestContext
) -> None:
    share, versions = FakeShare(), FakeVersions()
    a, b = replica(ruleset_file, share, versions), replica(ruleset_file, share, versions)
    file_version = b.get_ruleset().version
    result = await a.reload(SMALL)
    assert not await a.sync_shared()  # its own ruleset: nothing to do
    assert await b.sync_shared()
    assert b.get_ruleset().version == result.version
    bumps = len(versions.bumps)
    assert not await b.sync_shared() and len(versions.bumps) == bumps  # adopting does not bump again

    late = replica(ruleset_file, share, versions)  # a replica that starts now
    assert await late.sync_shared() and late.get_ruleset().version == result.version

    await a.reload("")  # back to the file
    assert share.value is None
    assert await b.sync_shared() and b.get_ruleset().version == file_version


async def test_an_unshareable_reload_is_rolled_back(ruleset_file: Path, admin: rc.RequestContext) -> None:
    share = FakeShare(down=True)
    a = replica(ruleset_file, share, FakeVersions())
    before = a.get_ruleset().version
    with pytest.raises(Unavailable):
        await a.reload(SMALL)
    assert a.get_ruleset().version == before


async def test_a_broken_shared_ruleset_is_rejected_once(ruleset_file: Path, admin: rc.RequestContext) -> None:
    share = FakeShare(value=("rules: [\n", "deadbeef"))
    b = replica(ruleset_file, share, FakeVersions())
    before = b.get_ruleset().version
    assert not await b.sync_shared()
    assert not await b.sync_shared()
    assert b.get_ruleset().version == before
