"""Ending owned tasks (pipecat_veena.tasks): a caller cancelled while it waits keeps its own
cancellation, and the tasks it ends finish their clean-up undisturbed."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from pipecat_veena.tasks import cancel_and_wait


@pytest.mark.parametrize("steps", range(1, 6))
async def test_a_cancel_scope_around_the_owner_keeps_its_cancellation(steps):
    """The owner (a Starlette handler in an AnyIO cancel scope) ends a task of its own while
    the scope is cancelled, ``steps`` event-loop steps after the owner started: the scope
    must take the cancellation as its own and end quietly. (With a bare ``gather`` at step 2
    the task's own CancelledError escapes the scope: a WebSocket test failed that way.)"""
    scope: list[anyio.CancelScope] = []

    async def owner() -> None:
        with anyio.CancelScope() as cs:
            scope.append(cs)
            child = asyncio.create_task(asyncio.Event().wait())
            await asyncio.sleep(0)
            await cancel_and_wait(child)
            await asyncio.sleep(1)  # not reached when the scope was cancelled first

    task = asyncio.create_task(owner())
    for _ in range(steps):
        await asyncio.sleep(0)
    scope[0].cancel()
    await asyncio.wait_for(task, 2)  # raises CancelledError if it escaped the scope
    assert scope[0].cancelled_caught


async def test_the_ended_tasks_finish_their_clean_up_when_the_owner_is_cancelled():
    cleaned = asyncio.Event()

    async def worker() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)  # e.g. aborting an engine request
            cleaned.set()

    child = asyncio.create_task(worker())
    await asyncio.sleep(0)
    owner = asyncio.create_task(cancel_and_wait(child))
    await asyncio.sleep(0.01)
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    await asyncio.wait_for(cleaned.wait(), 2)  # the owner's cancel did not cut it short
    assert child.done()
