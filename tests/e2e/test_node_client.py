"""End to end: the TypeScript client (clients/node, Connect-ES over gRPC) against the mesh's
ChatService in front of the real model. The client's script (clients/node/src/e2e.ts) makes the
calls and prints what it saw as JSON; this test checks it. Model output is never compared to
exact strings."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from services.runtime import context as rc
from services.runtime.cache_status import CacheStatus
from tests.e2e.mesh import KEYS, Mesh

pytestmark = pytest.mark.slow

NODE_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node"
SETUP_HINT = "run `bash clients/node/setup.sh` (npm ci from package-lock.json, buf generate)"
DEADLINE_MS = 100
# The floor namespace the script adds to its repeated call (clients/node/src/e2e.ts).
ECHOED_NAMESPACE = "node client,e2e"
# Two short streamed completions, one refused call and one cut at its deadline, plus Node's start.
RUN_TIMEOUT_S = 300.0


@pytest.fixture(scope="session")
def node_client() -> list[str]:
    """The command that runs the client's e2e script; fails (never skips) when Node, the
    client's packages or its generated code are missing. Session-scoped and requested first, so
    a missing setup fails before the mesh (and the engine) start."""
    node = shutil.which("node")
    tsx = NODE_CLIENT / "node_modules" / ".bin" / "tsx"
    generated = NODE_CLIENT / "src" / "gen" / "llmesh" / "v1" / "chat_pb.ts"
    missing = [
        what
        for what, present in (
            ("node (Node.js >= 18.14.1)", node is not None),
            (str(tsx.relative_to(NODE_CLIENT.parents[1])), tsx.exists()),
            (str(generated.relative_to(NODE_CLIENT.parents[1])), generated.exists()),
        )
        if not present
    ]
    if missing:
        pytest.fail(f"the Node client is not set up ({', '.join(missing)} missing): {SETUP_HINT}")
    return [str(tsx), "src/e2e.ts"]


async def run_client(command: list[str], mesh: Mesh) -> dict[str, Any]:
    # The gateway runs in this event loop: the client must not block it.
    proc = await asyncio.create_subprocess_exec(
        *command,
        "--address",
        mesh.chat_address,
        "--api-key",
        KEYS["main"],
        "--deadline-ms",
        str(DEADLINE_MS),
        cwd=NODE_CLIENT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=RUN_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"the Node client did not finish within {RUN_TIMEOUT_S:g} s")
    assert proc.returncode == 0, (
        f"the Node client failed ({SETUP_HINT} if setup is stale):\n{stderr.decode()}"
    )
    result: dict[str, Any] = json.loads(stdout)
    return result


def succeeded(result: dict[str, Any], call: str) -> dict[str, Any]:
    outcome: dict[str, Any] = result[call]
    assert "error" not in outcome, f"{call}: {outcome['error']}"
    return outcome


def versions_of(outcome: dict[str, Any]) -> dict[str, int]:
    return {namespace: int(version) for namespace, version in outcome["versions"].items()}


async def test_node_client_against_chat_service(node_client: list[str], mesh: Mesh) -> None:
    result = await run_client(node_client, mesh)

    stream = succeeded(result, "stream")
    assert stream["text"].strip()
    assert stream["messages"] >= 1 and stream["completionTokens"] > 0, stream
    statuses = {status.value for status in CacheStatus}
    assert stream["cacheStatus"] in statuses, stream
    assert stream["cacheStatusField"] == stream["cacheStatus"], "trailer and last message disagree"
    # The version trailer: the client's parse (exact: decimal strings) agrees with the mesh's own.
    assert stream["versionHeader"], "no x-llmesh-cache-version trailer"
    versions = versions_of(stream)
    assert versions == rc.parse_versions(stream["versionHeader"]), stream
    assert "policy" in versions, stream

    # The same greedy request again, with those versions as its floors (read-your-writes) plus
    # one of its own namespace: served from the response cache, with its age; the trailer
    # returns every floor (the client's percent-encoding decoded by the mesh).
    repeat = succeeded(result, "repeat")
    assert stream["cacheStatus"] == CacheStatus.MISS, stream
    assert repeat["cacheStatus"] == CacheStatus.HIT, repeat
    assert repeat["cacheStatusField"] == CacheStatus.HIT
    assert repeat["text"] == stream["text"]
    assert isinstance(repeat["ageMs"], int) and repeat["ageMs"] >= 0, repeat
    repeat_versions = versions_of(repeat)
    assert repeat_versions == rc.parse_versions(repeat["versionHeader"]), repeat
    assert all(repeat_versions.get(ns, -1) >= v for ns, v in versions.items()), (versions, repeat_versions)
    assert repeat_versions.get(ECHOED_NAMESPACE) == 7, repeat

    refused = result["unauthenticated"]
    assert refused["code"] == "UNAUTHENTICATED", refused
    assert "API key" in refused["message"], refused

    deadline = result["deadline"]
    assert deadline["code"] == "DEADLINE_EXCEEDED", deadline
    # Cut at its deadline, not after the 512 tokens it asked for.
    assert deadline["elapsedMs"] < DEADLINE_MS + 5_000, deadline
