"""Recent latencies with percentiles: bounded memory, recent behaviour."""

from __future__ import annotations

import statistics
from collections import deque

__all__ = ["LatencyWindow"]

_WINDOW = 512  # latencies kept for percentiles


class LatencyWindow:
    """The most recent latencies (seconds) with p50/p95."""

    def __init__(self, size: int = _WINDOW) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self.count = 0
        self.last: float | None = None

    def add(self, value: float) -> None:
        self._values.append(value)
        self.count += 1
        self.last = value

    def percentile(self, q: float) -> float | None:
        if not self._values:
            return None
        if len(self._values) == 1:
            return self._values[0]
        cuts = statistics.quantiles(self._values, n=100, method="inclusive")
        return cuts[min(98, max(0, round(q * 100) - 1))]
