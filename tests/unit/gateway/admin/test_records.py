"""What the admin store keeps: names, keys, statuses, tenant settings and their bounds."""

from __future__ import annotations

import pytest

from gateway.admin.records import (
    KEY_PREFIX,
    MAX_LIST_ITEMS,
    Change,
    KeyRecord,
    KeyStatus,
    TenantRecord,
    check_key_id,
    check_tenant_name,
    digest,
    key_changed,
    new_secret,
    tenant_changed,
    tenant_settings,
)
from gateway.auth import hash_key
from gateway.config import TenantSettings
from services.runtime.errors import InvalidArgument


def test_secrets_are_random_prefixed_and_stored_as_their_hash_only() -> None:
    first, second = new_secret(), new_secret()
    assert first.startswith(KEY_PREFIX) and first != second
    assert len(first) >= len(KEY_PREFIX) + 43  # 256 bits, base64url
    assert digest(first) != digest(second) and first not in digest(first)
    # The configuration's form (LLMESH_GATEWAY_API_KEYS) is the same digest.
    assert hash_key(first) == "sha256:" + digest(first)


@pytest.mark.parametrize("name", ["team-a", "A_b.9", "x" * 128])
def test_tenant_names_accepted(name: str) -> None:
    assert check_tenant_name(name) == name


@pytest.mark.parametrize("name", ["", "a:b", "x" * 129, "é", "a b", "a/b"])
def test_tenant_names_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match="tenant name"):
        check_tenant_name(name)


@pytest.mark.parametrize("key_id", ["", "abc", "key_a:b", "key_" + "a" * 80, "../key_x"])
def test_key_ids_refused(key_id: str) -> None:
    with pytest.raises(InvalidArgument):
        check_key_id(key_id)


def _record(**fields: object) -> KeyRecord:
    base: dict[str, object] = {"id": "key_00", "tenant": "t", "digest": "d" * 64, "created_at": 1000}
    return KeyRecord.model_validate({**base, **fields})


def test_key_status_active_expired_revoked() -> None:
    assert _record().status(now=10**10) is KeyStatus.ACTIVE
    expiring = _record(expires_at=2000)
    assert expiring.status(now=1999) is KeyStatus.ACTIVE
    assert expiring.status(now=2000) is KeyStatus.EXPIRED
    # Revoked wins over expired.
    assert _record(expires_at=2000, revoked_at=1500).status(now=3000) is KeyStatus.REVOKED


def test_redacted_value_shows_only_the_prefix_and_last_four() -> None:
    assert _record(hint="wxyz").redacted == f"{KEY_PREFIX}...wxyz"


def test_tenant_settings_take_every_field_of_tenant_settings() -> None:
    settings = tenant_settings(
        {"models": ["m1"], "requests_per_minute": 5, "token_budget_per_day": 1000, "policy_fail_open": True}
    )
    assert settings == TenantSettings(
        models=["m1"], requests_per_minute=5, token_budget_per_day=1000, policy_fail_open=True
    )


def test_unknown_tenant_setting_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument) as caught:
        tenant_settings({"requests_per_min": 5})
    assert "unknown tenant setting 'requests_per_min'" in caught.value.message
    assert "requests_per_minute" in caught.value.message  # the known settings are listed


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"token_budget_per_day": -1}, "token_budget_per_day"),
        ({"requests_per_minute": -5}, "between 0"),
        ({"requests_per_minute": "many"}, "requests_per_minute"),
        ({"models": ["m"] * (MAX_LIST_ITEMS + 1)}, "more than"),
        ({"models": ["m" * 300]}, "longer than"),
        ({"tokens_per_minute": 2**60}, "between 0"),
    ],
)
def test_tenant_settings_are_bounded(values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        tenant_settings(values)


def test_change_messages_round_trip_with_the_record() -> None:
    key = _record(version=3)
    parsed = Change.model_validate_json(key_changed(key))
    assert parsed.kind == "key" and parsed.key == key
    tenant = TenantRecord(name="t", settings=TenantSettings(models=["m"]), created_at=1, updated_at=2)
    parsed = Change.model_validate_json(tenant_changed(tenant))
    assert parsed.kind == "tenant" and parsed.tenant == tenant


def test_stored_tenant_record_without_a_newer_field_gets_its_default() -> None:
    # A record written before a field existed still loads: the field takes its default.
    old = '{"name": "t", "settings": {"models": ["m"]}, "created_at": 1, "updated_at": 1}'
    record = TenantRecord.model_validate_json(old)
    assert record.settings.models == ["m"] and record.settings.token_budget_per_day == 0
