"""Process groups of the harness's children, and loopback ports.

Every child (a service, a redis-server, a sentinel) runs in a process group of its own, listed in
:data:`LIVE_GROUPS` while it lives; an ``atexit`` hook, and SIGTERM/SIGHUP to the harness once
:func:`guard_signals` ran, kill whatever is still listed, so a harness that dies leaves nothing
behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import threading

HOST = "127.0.0.1"

# Process groups alive right now; the atexit hook kills them if nothing else did.
LIVE_GROUPS: set[int] = set()


def kill_leftovers() -> None:
    for pgid in list(LIVE_GROUPS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    LIVE_GROUPS.clear()


atexit.register(kill_leftovers)


def _on_terminate(signum: int, _frame: object) -> None:
    """SIGTERM/SIGHUP to the harness (a timeout, a closed terminal): take the children with it."""
    kill_leftovers()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def guard_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_terminate)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])
