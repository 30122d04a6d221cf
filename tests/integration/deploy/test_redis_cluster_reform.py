"""The Redis Cluster of components/redis-cluster re-forms after a full restart in which every node
gets a new address, on real redis-server processes.

Six nodes announce stable hostnames (node-0 ... node-5, as the StatefulSet's pods announce
redis-cluster-N.redis-cluster) and keep nodes.conf on their "volume" (a folder each). The test
runs the very scripts the component runs: deploy/redis/cluster/bootstrap.sh (the Job) and
deploy/redis/cluster/nodes-conf.sh (the init container of every node). Loopback addresses
127.0.0.2/3/4 stand in for the pod IPs of three lives, and a ``getent`` on the scripts' PATH
answers from a hosts file standing in for the cluster DNS (the only thing emulated: the scripts
are unchanged). Each node binds one address and dials from it (``bind-source-addr``), as a pod
with one IP does.

What it shows: the bootstrap creates the cluster once and is a no-op afterwards; after a full
restart on new addresses WITHOUT the init step the cluster never comes back (the bug of issue 18:
the bus dials the stored IPs); with it, the cluster is ok again within a bound and every key
written before is read back through a cluster client.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fixtures.processes import ROOT, ChildProcess

SCRIPTS = ROOT / "deploy" / "redis" / "cluster"
# This test's ports (16400-16415): six client ports and six cluster-bus ports.
PORTS = list(range(16400, 16406))
BUS_OFFSET = 6
NODE_TIMEOUT_MS = 2000
START_TIMEOUT_S = 20.0
STATE_TIMEOUT_S = 30.0
KEYS = 300
# The DNS of the test: "IP NAME" lines; the scripts' getent reads it.
GETENT = """#!/bin/sh
# getent hosts NAME, answered from $LLMESH_TEST_HOSTS ("IP NAME" lines).
[ "$1" = hosts ] || exit 2
awk -v n="$2" '$2 == n { print $1, $2; found = 1 } END { exit !found }' "$LLMESH_TEST_HOSTS"
"""


def _ready(line: str) -> bool | None:
    return True if "Ready to accept connections" in line else None


class Cluster:
    """Six cluster-enabled redis-servers, each with its own folder (its volume), all on one
    loopback address at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hosts = root / "hosts"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        getent = bin_dir / "getent"
        getent.write_text(GETENT, encoding="utf-8")
        getent.chmod(0o755)
        self.env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "LLMESH_TEST_HOSTS": str(self.hosts),
        }
        self.address = ""
        self.procs: list[ChildProcess] = []

    def volume(self, index: int) -> Path:
        folder = self.root / f"node-{index}"
        folder.mkdir(exist_ok=True)
        return folder

    def move_to(self, address: str) -> None:
        """The "DNS" now answers ``address`` for every node (their pods got new IPs)."""
        self.hosts.write_text("".join(f"{address} node-{i}\n" for i in range(len(PORTS))), encoding="utf-8")

    def start(self, address: str) -> None:
        assert not self.procs
        self.address = address
        for index, port in enumerate(PORTS):
            proc = ChildProcess(
                ["redis-server", "--port", str(port), "--bind", address, "--bind-source-addr", address,
                 "--cluster-enabled", "yes", "--cluster-port", str(port + BUS_OFFSET),
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                 "--cluster-announce-hostname", f"node-{index}",
                 "--cluster-preferred-endpoint-type", "hostname",
                 "--dir", str(self.volume(index)), "--appendonly", "yes", "--save", "",
                 # As in the redis image (built with protected mode off): replicas dial from
                 # an address other than 127.0.0.1.
                 "--protected-mode", "no",
                 "--loglevel", "notice"],
            )  # fmt: skip
            self.procs.append(proc)
            proc.wait_for(_ready, START_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM to every node (a graceful stop: AOF flushed, nodes.conf kept)."""
        for proc in self.procs:
            proc.stop()
            proc.close()
        self.procs = []

    def nodes(self) -> list[str]:
        return [f"{self.address}:{port}" for port in PORTS]

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host=self.address, port=port, socket_timeout=5, decode_responses=True)

    def states(self) -> list[str]:
        states = []
        for port in PORTS:
            with self.client(port) as node:
                info = node.execute_command("CLUSTER INFO")
            text = info if isinstance(info, str) else "\n".join(f"{k}:{v}" for k, v in info.items())
            state = next(
                (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("cluster_state:")),
                "",
            )
            states.append(state)
        return states

    def wait_states(self, wanted: str, timeout_s: float = STATE_TIMEOUT_S) -> float:
        """Seconds until every node reports ``cluster_state:<wanted>`` (polled, bounded)."""
        started = time.monotonic()
        states: list[str] = []
        while time.monotonic() - started < timeout_s:
            states = self.states()
            if all(state == wanted for state in states):
                return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"cluster not {wanted} after {timeout_s:.0f} s: {states}")

    def cluster_client(self) -> redis.RedisCluster:
        """A cluster client that reaches the nodes by their announced names (CLUSTER SHARDS and
        MOVED give node-N) at their current address, as the cluster DNS would."""
        address = self.address

        def remap(host_port: tuple[str, int]) -> tuple[str, int]:
            return address, host_port[1]

        return redis.RedisCluster(
            host=address, port=PORTS[0], decode_responses=True, address_remap=remap, socket_timeout=5
        )

    def wait_replicas_synced(self, timeout_s: float = STATE_TIMEOUT_S) -> None:
        """Every primary's replicas have its whole stream, so nothing written is only on a
        primary when the cluster stops."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lagging = []
            for port in PORTS:
                with self.client(port) as node:
                    info = node.info("replication")
                if info["role"] != "master":
                    continue
                offsets = [
                    v["offset"] for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                ]
                if not offsets or min(offsets) < info["master_repl_offset"]:
                    lagging.append(port)
            if not lagging:
                return
            time.sleep(0.1)
        raise AssertionError(f"replicas of {lagging} did not catch up within {timeout_s:.0f} s")

    def script(
        self, name: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", str(SCRIPTS / name), *args],
            env={**os.environ, **self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    assert shutil.which("redis-server"), "redis-server not found: scripts/install.sh installs it"
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        with contextlib.suppress(Exception):
            made.stop()
        for proc in made.procs:
            proc.close()


def test_cluster_reforms_after_every_node_changed_address(cluster: Cluster) -> None:
    # First life on 127.0.0.2: the Job's bootstrap creates the cluster.
    cluster.move_to("127.0.0.2")
    cluster.start("127.0.0.2")
    created = cluster.script("bootstrap.sh", *cluster.nodes())
    assert created.returncode == 0, created.stdout + created.stderr
    assert "creating the cluster" in created.stdout
    cluster.wait_states("ok")
    written = {f"llmesh:reform:{i}": f"value-{i}" for i in range(KEYS)}
    with cluster.cluster_client() as client:
        for key, value in written.items():
            client.set(key, value)
        # The keys spread over the three primaries.
        assert len({client.get_node_from_key(k).name for k in written}) == 3
    # Run again (the Job re-created, or retried): nothing to do.
    again = cluster.script("bootstrap.sh", *cluster.nodes())
    assert again.returncode == 0 and "already formed" in again.stdout, again.stdout + again.stderr
    cluster.wait_replicas_synced()
    cluster.stop()

    # Second life on 127.0.0.3, nodes.conf as it was: the bus dials the old IPs and the cluster
    # stays down; the bootstrap refuses to create a cluster over the nodes' data.
    cluster.move_to("127.0.0.3")
    cluster.start("127.0.0.3")
    cluster.wait_states("fail")
    refused = cluster.script(
        "bootstrap.sh", *cluster.nodes(), extra_env={"REDIS_CLUSTER_BOOTSTRAP_TIMEOUT": "3"}
    )
    assert refused.returncode != 0, refused.stdout
    assert "already belongs to a cluster" in refused.stdout
    assert "creating" not in refused.stdout
    cluster.stop()

    # Third life on 127.0.0.4, each node's init step first (the pod's IP as MY_IP).
    cluster.move_to("127.0.0.4")
    for index in range(len(PORTS)):
        rewrite = cluster.script("nodes-conf.sh", str(cluster.volume(index) / "nodes.conf"), "127.0.0.4")
        assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
        assert "-> 127.0.0.4" in rewrite.stdout
    cluster.start("127.0.0.4")
    reformed_s = cluster.wait_states("ok")
    print(f"cluster re-formed {reformed_s:.1f} s after the last node started")
    formed = cluster.script("bootstrap.sh", *cluster.nodes())
    assert formed.returncode == 0 and "already formed" in formed.stdout, formed.stdout + formed.stderr
    with cluster.cluster_client() as client:
        assert {key: client.get(key) for key in written} == written
        # Writable again, too.
        client.set("llmesh:reform:after", "1")
    for port in PORTS:
        with cluster.client(port) as node:
            nodes = node.execute_command("CLUSTER NODES")
        assert "127.0.0.2" not in str(nodes) and "127.0.0.3" not in str(nodes), nodes


def test_init_step_leaves_a_new_node_alone(tmp_path: Path) -> None:
    """No nodes.conf yet (a new pod, an empty volume): nothing to rewrite, and the server then
    starts as a new node."""
    missing = tmp_path / "nodes.conf"
    done = subprocess.run(
        ["sh", str(SCRIPTS / "nodes-conf.sh"), str(missing), "10.0.0.9"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not missing.exists()
    usage = subprocess.run(
        ["sh", str(SCRIPTS / "bootstrap.sh")], capture_output=True, text=True, timeout=30, check=False
    )
    assert usage.returncode == 2 and "usage" in usage.stderr
