"""`llmesh admin` without a gateway: durations, where the admin token comes from, and the
token `llmesh up` hands the gateway."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.runtime.cli import admin, catalog
from services.runtime.cli.up import child_env


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("12h", 43200), ("30d", 2592000), ("2w", 1209600)],
)
def test_durations(text: str, seconds: int) -> None:
    assert admin.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "soon", "5y", "1.5h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        admin.parse_duration(text)


def test_admin_token_from_flag_then_env_then_the_file_llmesh_up_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("LLMESH_GATEWAY_ADMIN_TOKEN", raising=False)
    with pytest.raises(admin.AdminError, match="no admin token"):
        admin._token(None)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "admin-token").write_text("from-file\n")
    assert admin._token(None) == "from-file"
    monkeypatch.setenv("LLMESH_GATEWAY_ADMIN_TOKEN", "from-env")
    assert admin._token(None) == "from-env"
    assert admin._token("from-flag") == "from-flag"


def test_llmesh_up_gives_the_gateway_its_admin_token_and_the_policy_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "LLMESH_GATEWAY_ADMIN_TOKEN",
        "LLMESH_GATEWAY_POLICY_ADMIN_TOKEN",
        "LLMESH_POLICY_ADMIN_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    gateway, policy = catalog.service("gateway"), catalog.service("policy")
    assert gateway is not None and policy is not None
    env = child_env(gateway, 50050, "127.0.0.1", {}, "the-token")
    assert env["LLMESH_GATEWAY_ADMIN_TOKEN"] == env["LLMESH_GATEWAY_POLICY_ADMIN_TOKEN"] == "the-token"
    assert child_env(policy, 50052, "127.0.0.1", {}, "the-token")["LLMESH_POLICY_ADMIN_TOKEN"] == "the-token"
    # An operator's own gateway token is kept.
    monkeypatch.setenv("LLMESH_GATEWAY_ADMIN_TOKEN", "mine")
    assert child_env(gateway, 50050, "127.0.0.1", {}, "the-token")["LLMESH_GATEWAY_ADMIN_TOKEN"] == "mine"
