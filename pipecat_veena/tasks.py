"""Ending asyncio tasks that a caller owns.

Every owner here ends its tasks the same way: cancel them, then wait until they have ended. The
wait is shielded. A bare ``gather`` of a task that was just cancelled, itself cancelled in the
same event-loop step (a client leaving while its handler cleans up), re-cancels the tasks in the
middle of their own clean-up (an engine request's abort) and may raise the task's CancelledError
instead of the caller's. AnyIO's cancel scopes, which Starlette runs every request and WebSocket
handler in, then do not recognise that error as theirs and let it escape the scope.
"""

from __future__ import annotations

import asyncio


async def wait_ended(*tasks: asyncio.Future) -> None:
    """Wait until every one of ``tasks`` has ended; their results and errors are dropped.

    If the caller is cancelled meanwhile, the tasks go on ending undisturbed and the caller
    gets its own CancelledError (the one its canceller sent).
    """
    if tasks:
        await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))


async def cancel_and_wait(*tasks: asyncio.Future) -> None:
    """Cancel ``tasks`` (those still running) and wait until they have ended (``wait_ended``)."""
    for task in tasks:
        task.cancel()
    await wait_ended(*tasks)
