"""User-space link emulator: two network namespaces joined through TUN devices by a process that
delays, jitters and drops packets (this kernel has no ``netem``).

::

    netns A: llqA<id> 10.77.<n>.1 ─tun─▶ [emulator: delay ± jitter, loss] ─tun─▶ llqB<id> 10.77.<n>.2

``EmulatedLink`` (a context manager, root only) creates both namespaces, starts the emulator as a
child process (``python -m benchmarks.quic.linkemu``), waits for it to report readiness and on
exit stops it and deletes the namespaces, also when setup fails half-way. Sockets are put into a
namespace with ``services.runtime.quic.udp.in_netns`` (the thread enters the namespace only while
the socket is created; a socket stays in the namespace it was created in). Delays are per
direction (RTT/2 each way); loss is independent per packet. Jitter is either netem-style
(``reorder=True``: each packet's delay drawn independently, so packets overtake each other) or FIFO
(each packet leaves no earlier than the one before, so jitter alone never reorders). ``set()``
changes delay, jitter and loss of the running link.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import heapq
import itertools
import logging
import os
import random
import select
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from types import TracebackType

logger = logging.getLogger(__name__)

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_READY = "READY"
_OK = "OK"
_counter = itertools.count()


def unavailable_reason() -> str | None:
    """Why the emulator cannot run here (None when it can): tests skip with this reason."""
    if os.geteuid() != 0:
        return "link emulator needs root (network namespaces, TUN devices)"
    if not os.path.exists("/dev/net/tun"):
        return "link emulator needs /dev/net/tun"
    if shutil.which("ip") is None:
        return "link emulator needs the iproute2 'ip' command"
    return None


@dataclass(frozen=True)
class LinkSpec:
    """Round-trip delay, its jitter (uniform ±) and per-packet loss probability (each direction)."""

    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    # netem-style jitter: each packet's delay is drawn independently, so packets reorder.
    reorder: bool = False

    def describe(self) -> str:
        text = f"{self.rtt_ms:g}±{self.jitter_ms:g} ms RTT" + (" (reordering)" if self.reorder else "")
        return text + (f", {self.loss:.0%} loss" if self.loss else "")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class EmulatedLink:
    """Two namespaces ``ns_a``/``ns_b`` with addresses ``addr_a``/``addr_b`` over an emulated link."""

    def __init__(self, spec: LinkSpec, seed: int = 1) -> None:
        n = next(_counter)
        tag = f"{os.getpid() % 100000}{n}"
        self.spec = spec
        self.seed = seed
        self.ns_a, self.ns_b = f"llq{tag}a", f"llq{tag}b"
        self.dev_a, self.dev_b = f"llqA{tag}"[:15], f"llqB{tag}"[:15]
        subnet = 1 + (os.getpid() + n) % 250
        self.addr_a, self.addr_b = f"10.77.{subnet}.1", f"10.77.{subnet}.2"
        # A second client address, for connection-migration tests.
        self.addr_a2 = f"10.77.{subnet}.3"
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> EmulatedLink:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _start(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        args = [
            sys.executable, "-m", "benchmarks.quic.linkemu",
            "--ns-a", self.ns_a, "--ns-b", self.ns_b, "--dev-a", self.dev_a, "--dev-b", self.dev_b,
            "--addr-a", self.addr_a, "--addr-a2", self.addr_a2, "--addr-b", self.addr_b,
            "--rtt-ms", str(self.spec.rtt_ms), "--jitter-ms", str(self.spec.jitter_ms),
            "--loss", str(self.spec.loss), "--reorder", str(int(self.spec.reorder)), "--seed", str(self.seed),
        ]  # fmt: skip
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect(_READY, 15.0)

    def _expect(self, word: str, timeout: float) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        line = self._proc.stdout.readline().strip() if ready else ""
        if line != word:
            raise RuntimeError(f"link emulator: expected {word}, got {line!r} (exit {self._proc.poll()})")

    def set(self, spec: LinkSpec) -> None:
        """Change delay, jitter and loss of the running link (packets already queued keep theirs)."""
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(f"{spec.rtt_ms} {spec.jitter_ms} {spec.loss} {int(spec.reorder)}\n")
        self._proc.stdin.flush()
        self._expect(_OK, 5.0)
        self.spec = spec

    def close(self) -> None:
        """Stop the emulator and delete both namespaces (idempotent)."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
            self._proc = None
        for ns in (self.ns_a, self.ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)


# -- the emulator process ---------------------------------------------------------------------


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


def _configure(dev: str, ns: str, addresses: list[str]) -> None:
    # The emulator is the link, not a 500-packet queue: a deep device queue keeps a briefly
    # descheduled emulator from dropping bursts neither transport would see on a real path.
    _ip("link", "set", dev, "txqueuelen", "10000")
    _ip("link", "set", dev, "netns", ns)
    for address in addresses:
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
    _ip("-n", ns, "link", "set", dev, "up")


class _Direction:
    """One direction of the link: a FIFO of (due time, packet)."""

    def __init__(self, out_fd: int, spec: LinkSpec, rng: random.Random) -> None:
        self.out_fd = out_fd
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.heap: list[tuple[float, int, bytes]] = []
        self._seq = itertools.count()
        self._rng = rng
        self._last_due = 0.0
        self.configure(spec)

    def configure(self, spec: LinkSpec) -> None:
        self._one_way = spec.rtt_ms / 2000.0
        self._jitter = spec.jitter_ms / 2000.0
        self._loss = spec.loss
        self._reorder = spec.reorder

    def push(self, packet: bytes, now: float) -> None:
        if self._loss and self._rng.random() < self._loss:
            return
        due = now + self._one_way + (self._rng.uniform(-self._jitter, self._jitter) if self._jitter else 0.0)
        if self._reorder:
            heapq.heappush(self.heap, (due, next(self._seq), packet))
            return
        due = max(due, self._last_due)  # in order: jitter without reordering
        self._last_due = due
        self.queue.append((due, packet))

    def next_due(self) -> float | None:
        if self.queue and self.heap:
            return min(self.queue[0][0], self.heap[0][0])
        if self.queue:
            return self.queue[0][0]
        return self.heap[0][0] if self.heap else None

    def flush(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            packet = heapq.heappop(heap)[2]
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self.out_fd, packet)
        queue = self.queue
        while queue and queue[0][0] <= now:
            _, packet = queue.popleft()
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self.out_fd, packet)


def _serve(fd_a: int, fd_b: int, spec: LinkSpec, seed: int) -> None:
    rng = random.Random(seed)
    a_to_b = _Direction(fd_b, spec, rng)
    b_to_a = _Direction(fd_a, spec, rng)
    sources = {fd_a: a_to_b, fd_b: b_to_a}
    poller = select.poll()
    for fd in sources:
        poller.register(fd, select.POLLIN)
    control = sys.stdin.fileno()
    poller.register(control, select.POLLIN)
    while True:
        now = time.monotonic()
        heads = [t for t in (a_to_b.next_due(), b_to_a.next_due()) if t is not None]
        timeout_ms = max(0, int((min(heads) - now) * 1000 + 0.999)) if heads else 1000
        for fd, _ in poller.poll(timeout_ms):
            if fd == control:
                line = sys.stdin.readline()
                if not line:
                    return  # parent went away
                rtt, jitter, loss, reorder = (float(x) for x in line.split())
                for d in (a_to_b, b_to_a):
                    d.configure(LinkSpec(rtt, jitter, loss, bool(reorder)))
                print(_OK, flush=True)
                continue
            direction = sources[fd]
            now = time.monotonic()
            for _ in range(256):
                try:
                    packet = os.read(fd, 65535)
                except BlockingIOError:
                    break
                direction.push(packet, now)
        now = time.monotonic()
        a_to_b.flush(now)
        b_to_a.flush(now)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="TUN link emulator (run by EmulatedLink)")
    for name in ("--ns-a", "--ns-b", "--dev-a", "--dev-b", "--addr-a", "--addr-a2", "--addr-b"):
        parser.add_argument(name, required=True)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--reorder", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    fd_a, fd_b = _open_tun(args.dev_a), _open_tun(args.dev_b)
    _configure(args.dev_a, args.ns_a, [args.addr_a, args.addr_a2])
    _configure(args.dev_b, args.ns_b, [args.addr_b])
    print(_READY, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        _serve(fd_a, fd_b, LinkSpec(args.rtt_ms, args.jitter_ms, args.loss, bool(args.reorder)), args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
