from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy.config import DEFAULT_RULESET
from policy.rules import Action
from policy.service import ChatText, PolicyService
from policy.store import RulesetStore
from services.runtime import context as rc
from services.runtime.errors import InvalidArgument, PermissionDenied, Unavailable
from tests.fixtures.context import activated
from tests.unit.policy.fakes import FakeAudit, FakeTenants, FakeVersions, small_ruleset

SMALL = small_ruleset("small", "tenants:\n  acme:\n    audit_store_text: true\n")


@pytest.fixture
def ruleset_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_bytes(DEFAULT_RULESET.read_bytes())
    return path


@pytest.fixture
def tenant() -> Iterator[rc.RequestContext]:
    ctx = rc.new_context(tenant="default")
    with activated(ctx):
        yield ctx


def make(path: Path, **kw: object) -> tuple[PolicyService, FakeAudit, FakeVersions, FakeTenants]:
    audit, versions, tenants = FakeAudit(), FakeVersions(), FakeTenants({"beta"})
    service = PolicyService(RulesetStore(path), audit, versions, tenants, **kw)  # type: ignore[arg-type]
    return service, audit, versions, tenants


async def test_check_input_audits_and_observes_the_policy_version(
    ruleset_file: Path, tenant: rc.RequestContext
) -> None:
    service, audit, _, tenants = make(ruleset_file)
    decision = await service.check_input([ChatText("user", "mail x@example.com")], [])
    assert decision.action == Action.REDACT
    (rec,) = audit.records
    assert rec.tenant == "default" and rec.rule_ids == ("pii",) and rec.text is None
    assert rec.request_id == tenant.request_id and rec.text_sha256 == decision.text_sha256
    assert tenant.observed["policy"] == 100 and "default" in tenants.known


async def test_reload_swaps_and_bumps_every_known_tenant(
    ruleset_file: Path, tenant: rc.RequestContext
) -> None:
    service, _, versions, _ = make(ruleset_file)
    old = service.get_ruleset().version
    result = await service.reload(SMALL)
    assert result.version != old and result.version.startswith("small+")
    assert result.rule_count == 1 and result.policy_version == 101
    assert set(versions.bumps) == {"default", "acme", "beta"}
    assert tenant.observed["policy"] == 101
    assert service.ruleset_for("acme").audit_store_text


async def test_invalid_ruleset_keeps_the_old_one(ruleset_file: Path, tenant: rc.RequestContext) -> None:
    service, _, versions, _ = make(ruleset_file)
    old = service.get_ruleset().version
    with pytest.raises(InvalidArgument, match="line 3"):
        await service.reload("rules:\n  - id: a\n    detector: nope\n    scope: input\n    action: block\n")
    assert service.get_ruleset().version == old and versions.bumps == []


async def test_failed_bump_rolls_back(ruleset_file: Path, tenant: rc.RequestContext) -> None:
    service, _, versions, _ = make(ruleset_file)
    old = service.get_ruleset().version
    versions.fail = True
    with pytest.raises(Unavailable):
        await service.reload(SMALL)
    assert service.get_ruleset().version == old


async def test_only_admin_tenants_reload(ruleset_file: Path, tenant: rc.RequestContext) -> None:
    service, *_ = make(ruleset_file, admin_tenants=["default"])
    tenant.tenant = "acme"
    with pytest.raises(PermissionDenied):
        await service.reload(SMALL)


async def test_store_text_only_when_the_tenant_asks(ruleset_file: Path, tenant: rc.RequestContext) -> None:
    service, audit, *_ = make(ruleset_file)
    await service.reload(SMALL)
    tenant.tenant = "acme"
    await service.check_output("a forbidden answer")
    assert audit.records[-1].text == "a forbidden answer" and audit.records[-1].action == "block"


async def test_limits_and_full_audit(ruleset_file: Path, tenant: rc.RequestContext) -> None:
    service, audit, *_ = make(ruleset_file, max_text_chars=10)
    with pytest.raises(InvalidArgument, match="limit is 10"):
        await service.check_output("x" * 11)
    audit.accepting = False
    with pytest.raises(Unavailable):
        await service.open_stream()


async def test_check_output_hash_is_of_the_released_text(
    ruleset_file: Path, tenant: rc.RequestContext
) -> None:
    import hashlib

    service, audit, *_ = make(ruleset_file)
    result = await service.check_output("write to x@example.com")
    assert result.released == "write to <EMAIL_1>"
    assert result.response_sha256 == hashlib.sha256(b"write to <EMAIL_1>").hexdigest()
    assert audit.records[-1].response_sha256 == result.response_sha256


async def test_stream_audits_once_even_when_abandoned(ruleset_file: Path, tenant: rc.RequestContext) -> None:
    service, audit, *_ = make(ruleset_file)
    stream = await service.open_stream()
    stream.feed("partial answer ")
    stream.close()
    stream.close()
    assert [r.kind for r in audit.records] == ["stream_abandoned"]
    done = await service.open_stream()
    done.feed("hi ")
    done.finish()
    done.close()
    assert [r.kind for r in audit.records] == ["stream_abandoned", "stream"]


async def test_file_watch_reloads_changes_and_rejects_invalid_files(
    ruleset_file: Path, tenant: rc.RequestContext
) -> None:
    service, _, versions, _ = make(ruleset_file)
    assert not await service.reload_file_if_changed()
    old = service.get_ruleset().version
    await asyncio.to_thread(ruleset_file.write_text, SMALL)
    os.utime(ruleset_file, ns=(1, 1))  # a distinct mtime even on a coarse clock
    assert await service.reload_file_if_changed()
    assert service.get_ruleset().version.startswith("small+") and service.get_ruleset().version != old
    bumps = len(versions.bumps)
    await asyncio.to_thread(ruleset_file.write_text, "rules: [\n")
    os.utime(ruleset_file, ns=(2, 2))
    assert not await service.reload_file_if_changed()
    assert service.get_ruleset().version.startswith("small+") and len(versions.bumps) == bumps
    assert not await service.reload_file_if_changed()  # reported once, not every tick


async def test_decisions_and_findings_are_counted(ruleset_file: Path, tenant: rc.RequestContext) -> None:
    from prometheus_client import REGISTRY

    def value(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    service, *_ = make(ruleset_file)
    decisions = value("llmesh_policy_decisions_total", {"kind": "output", "action": "redact"})
    emails = value("llmesh_policy_findings_total", {"rule": "pii", "entity": "EMAIL"})
    await service.check_output("mail a@example.com or b@example.com")
    assert value("llmesh_policy_decisions_total", {"kind": "output", "action": "redact"}) == decisions + 1
    assert value("llmesh_policy_findings_total", {"rule": "pii", "entity": "EMAIL"}) == emails + 2


async def test_a_bump_made_elsewhere_is_seen_once_the_cached_version_expires(
    ruleset_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica, an Invalidate or a Redis restart moves the version: reported within the TTL."""
    service, _, versions, _ = make(ruleset_file)
    assert await service.policy_version("acme") == 100
    versions.values[("acme", "policy")] = 250  # bumped behind this instance's back
    assert await service.policy_version("acme") == 100  # still within the cache TTL
    monkeypatch.setattr("policy.service.VERSION_TTL_S", 0.0)
    assert await service.policy_version("acme") == 250
