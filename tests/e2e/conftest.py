"""One mesh for the end-to-end tests (it shares the session's engine and embedding model)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.e2e.mesh import Mesh, start_mesh


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mesh(
    redis_url: str, inference_address: str, embeddings_address: str, tmp_path_factory: object
) -> AsyncIterator[Mesh]:
    tmp: Path = tmp_path_factory.mktemp("mesh")  # type: ignore[attr-defined]
    async with start_mesh(redis_url, inference_address, embeddings_address, tmp) as running:
        yield running
