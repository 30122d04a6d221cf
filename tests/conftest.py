"""Shared test setup: the Redis the suite uses and the plugins with service fixtures."""

from __future__ import annotations

import os

import pytest

# Session fixtures of the real services (one engine, one embedding model per test run).
pytest_plugins: list[str] = ["tests.fixtures.inference", "tests.fixtures.embeddings"]


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis of this test run (scripts/test.sh starts a throwaway one and exports REDIS_URL)."""
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
