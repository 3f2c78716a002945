"""The messages waiting for one WebSocket client, bounded in bytes."""

from __future__ import annotations

import asyncio
import collections


class Outbox:
    """Messages waiting for the client, bounded in bytes: ``put`` waits while it is full.

    One reader (the send loop); two events instead of a lock, so a message reaches the send
    loop in one event-loop step.

    Args:
        limit: bytes that may wait (one message over it still fits into an empty box).
    """

    def __init__(self, limit: int) -> None:
        self._items: collections.deque[bytes | str] = collections.deque()
        self._bytes = 0
        self._limit = limit
        self._filled = asyncio.Event()  # set while there are items
        self._drained = asyncio.Event()  # set when room was made

    async def put(self, item: bytes | str) -> None:
        """Queue ``item``, waiting while the box is full."""
        while self._bytes and self._bytes + len(item) > self._limit:
            self._drained.clear()
            await self._drained.wait()
        self.push_control(item)

    @property
    def empty(self) -> bool:
        """True when nothing waits to be sent."""
        return not self._items

    def push_control(self, item: bytes | str) -> None:
        """Queue a message now, over the limit if need be (small control messages only)."""
        self._items.append(item)
        self._bytes += len(item)
        self._filled.set()

    async def get(self) -> bytes | str:
        """The oldest message, waiting for one."""
        while not self._items:
            self._filled.clear()
            await self._filled.wait()
        item = self._items.popleft()
        self._bytes -= len(item)
        self._drained.set()
        return item
