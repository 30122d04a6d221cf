"""Stopping background tasks (services/runtime/tasks.py)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.runtime.tasks import cancel_and_wait


async def test_a_task_that_loses_its_cancellation_is_cancelled_again() -> None:
    """What Python 3.11's wait_for does when the inner call ends as the cancel arrives: the task
    goes back to an endless wait; one cancel would leave the stop hanging for ever."""
    lost = asyncio.Event()

    async def loop() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        lost.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, recancel_s=0.05), 5)
    assert lost.is_set() and task.cancelled()


async def test_a_task_error_is_raised_and_a_none_task_is_nothing() -> None:
    async def fails() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise ValueError("broke while stopping")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broke while stopping"):
        await cancel_and_wait(task)
    await cancel_and_wait(None)


async def test_the_callers_own_cancellation_still_reaches_it() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    task = asyncio.create_task(stubborn())
    stopper = asyncio.create_task(cancel_and_wait(task, recancel_s=0.05))
    await asyncio.sleep(0.2)
    assert not stopper.done()
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    release.set()
    await task
