"""Stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)

# How long a cancelled task gets to unwind before it is cancelled again.
RECANCEL_S = 1.0


async def cancel_and_wait(task: asyncio.Task[Any] | None, *, recancel_s: float = RECANCEL_S) -> None:
    """Cancels ``task`` (if any) and waits until it has unwound; its cancellation is not re-raised.

    A cancellation can be lost inside a library: on Python 3.11, ``asyncio.wait_for`` drops one
    that arrives in the loop iteration its inner call ends in, and redis-py writes every command
    under one. The cache's single-flight subscriber lost one in about one stop in a hundred
    right after a Redis restart, went back to its socket read (no timeout) and hung the stop.
    So the task is cancelled again every ``recancel_s`` until it is done, with a warning.
    """
    if task is None:
        return
    task.cancel()
    await asyncio.wait({task}, timeout=recancel_s)
    while not task.done():
        log.warning("task %s lost its cancellation; cancelling it again", task.get_name())
        task.cancel()
        await asyncio.wait({task}, timeout=recancel_s)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()
