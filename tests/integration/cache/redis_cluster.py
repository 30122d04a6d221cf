"""A real Redis Cluster of a test's own: three masters on loopback, no persistence.

Each node is a :class:`~tests.integration.cache.redis_proc.RedisProcess` (ready when it
says so) started with ``--cluster-enabled yes``; ``redis-cli --cluster create`` assigns
the 16384 slots, and the cluster is ready once every node's ``CLUSTER INFO`` reports
``cluster_state:ok`` (polled with a bound, not slept for).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

from tests.fixtures.ports import free_port
from tests.integration.cache.redis_proc import RedisProcess

READY_TIMEOUT_S = 30.0


class RedisCluster:
    """``masters`` cluster-enabled redis-servers (plus ``replicas`` per master) made one cluster."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        self.dir = tempfile.mkdtemp(prefix="llmesh-redis-cluster-")
        self.replicas = replicas
        self.nodes: list[RedisProcess] = []
        for _ in range(masters * (1 + replicas)):
            # A cluster node also listens on its cluster bus port, by default port + 10000, which
            # may fall in the kernel's ephemeral range, where an outgoing connection of the busy
            # test machine can hold it: the bus gets a free port of its own (free_port never
            # hands one out twice).
            port, bus = free_port(), free_port()
            node = RedisProcess(
                port,
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-port", str(bus),
                    "--cluster-config-file", f"{self.dir}/nodes-{port}.conf",
                    "--cluster-node-timeout", "2000",
                ],
                directory=self.dir,
            )  # fmt: skip
            self.nodes.append(node)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """A startup node's URL; the cluster client discovers the others."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def cli(self, port: int, *args: str, timeout: float = 10.0) -> str:
        done = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def state(self, port: int) -> str:
        """The node's ``cluster_state`` (``ok`` or ``fail``)."""
        for line in self.cli(port, "CLUSTER", "INFO").splitlines():
            if line.startswith("cluster_state:"):
                return line.split(":", 1)[1].strip()
        return ""

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            self.cli(
                self.ports[0],
                "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas", str(self.replicas), "--cluster-yes",
                timeout=READY_TIMEOUT_S,
            )  # fmt: skip
            self.wait_ok()
        except BaseException:
            self.close()
            raise

    def wait_ok(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Returns once every running node reports ``cluster_state:ok`` (bounded)."""
        deadline = time.monotonic() + timeout_s
        states: dict[int, str] = {}
        while time.monotonic() < deadline:
            states = {node.port: self.state(node.port) for node in self.nodes if node.proc is not None}
            if all(state == "ok" for state in states.values()):
                return
            # The nodes gossip the new configuration within a few cluster-bus pings.
            time.sleep(0.05)
        raise RuntimeError(f"redis cluster not ok after {timeout_s:.0f} s: {states}")

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
