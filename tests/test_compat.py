"""pipelines.compat.cancel_until_done: a task that swallows a cancellation still ends."""

from __future__ import annotations

import asyncio

import pytest

from pipelines.compat import cancel_until_done


async def test_a_task_that_swallows_its_first_cancellation_is_cancelled_again() -> None:
    """As asyncio.wait_for does before 3.12 when the awaited call completes together with
    the cancellation (CPython gh-86296): the task carries on as if nothing happened."""
    swallowed = 0
    served = asyncio.Event()

    async def link() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed == 0:
                    swallowed += 1  # the first one is lost, as in wait_for
                    served.set()
                    continue
                raise

    task = asyncio.create_task(link())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_until_done(task, every_s=0.05), timeout=5)
    assert served.is_set() and swallowed == 1
    assert task.cancelled()


async def test_a_finished_or_failing_task_costs_nothing() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_until_done(task)  # no exception
    assert isinstance(task.exception(), RuntimeError)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_until_done(done)
    assert done.done() and not done.cancelled()


async def test_the_callers_own_cancellation_still_propagates() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # swallows every cancellation until released

    task = asyncio.create_task(stubborn())
    waiter = asyncio.create_task(cancel_until_done(task, every_s=0.05))
    await asyncio.sleep(0.2)
    assert not task.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    task.cancel()  # one more wake-up: it sees the release and returns
    await asyncio.wait_for(task, timeout=5)
    assert task.done()
