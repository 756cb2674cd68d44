"""A bounded asyncio queue that sheds its oldest item when full, and counts what it shed.

Between stages we never block the producer (the MQTT receive loop must keep reading, or
the broker's keep-alive fails) and never grow without end. Shedding the oldest keeps the
freshest data, which is what an alerting pipeline behind on its input wants.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["SheddingQueue"]

T = TypeVar("T")


class SheddingQueue(Generic[T]):
    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._ready = asyncio.Event()
        self.shed = 0
        self.put_total = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> T | None:
        """Add an item; returns the item shed to make room, if any."""
        dropped = None
        if len(self._items) >= self.maxsize:
            dropped = self._items.popleft()
            self.shed += 1
        self._items.append(item)
        self.put_total += 1
        self._ready.set()
        return dropped

    async def get(self) -> T:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def get_nowait(self) -> T | None:
        return self._items.popleft() if self._items else None

    def full(self) -> bool:
        return len(self._items) >= self.maxsize

    async def wait(self) -> None:
        """Until an item is there (without taking it)."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
