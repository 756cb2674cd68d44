"""The request gate: who may send the engine a request now.

`ready` is set while the engine serves; `admit` while new analyses may also start (not
shedding load: the memory watchdog's warn level). Requests in flight are timed, so that
the supervisor's health check can tell a hang (`oldest_s`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["RequestGate"]


class RequestGate:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.ready = asyncio.Event()  # the engine serves requests
        self.admit = asyncio.Event()  # ... and new analyses may start (not shedding load)
        self.shedding = False
        self._inflight: dict[int, float] = {}
        self._ids = itertools.count()

    def open(self) -> None:
        """The engine serves: requests go through, new analyses unless shedding."""
        self.ready.set()
        if not self.shedding:
            self.admit.set()

    def close(self) -> None:
        """No request goes through (restarting, degraded, stopped)."""
        self.ready.clear()
        self.admit.clear()

    def shed(self, on: bool) -> None:
        """No new analyses while on; those in flight finish."""
        self.shedding = on
        if on:
            self.admit.clear()
        elif self.ready.is_set():
            self.admit.set()

    @contextmanager
    def request(self) -> Iterator[None]:
        """One request in flight for the block."""
        token = next(self._ids)
        self._inflight[token] = self._clock()
        try:
            yield
        finally:
            self._inflight.pop(token, None)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def oldest_s(self) -> float | None:
        """The age of the oldest request in flight (None when none is)."""
        if not self._inflight:
            return None
        return self._clock() - min(self._inflight.values())
