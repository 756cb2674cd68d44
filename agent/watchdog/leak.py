"""The slow way a long run dies: the service's own resident memory creeping up for hours.

A least-squares slope over a sliding window of RSS samples, in bytes per hour. No verdict
before `min_span_s` of history (start-up growth, caches filling, is not a leak). The
service only reports a suspected leak (log, status): restarting a whole service is
systemd's and the operator's call, with the numbers in hand.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["LeakDetector", "LeakVerdict"]


@dataclass(frozen=True)
class LeakVerdict:
    slope_bytes_per_hour: float | None  # None: not enough history yet
    span_s: float
    samples: int
    suspected: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "slope_mib_per_hour": None
            if self.slope_bytes_per_hour is None
            else round(self.slope_bytes_per_hour / (1 << 20), 2),
            "span_h": round(self.span_s / 3600, 2),
            "samples": self.samples,
            "suspected": self.suspected,
        }


class LeakDetector:
    def __init__(
        self, *, window_s: float, min_span_s: float, threshold_bytes_per_hour: float
    ) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.threshold = threshold_bytes_per_hour
        self._points: deque[tuple[float, int]] = deque()

    def add(self, t: float, rss: int) -> None:
        self._points.append((t, rss))
        while self._points and t - self._points[0][0] > self.window_s:
            self._points.popleft()

    def verdict(self) -> LeakVerdict:
        pts = self._points
        span = pts[-1][0] - pts[0][0] if len(pts) >= 2 else 0.0
        if span < self.min_span_s or len(pts) < 3:
            return LeakVerdict(None, span, len(pts), False)
        n = len(pts)
        t0 = pts[0][0]
        mean_t = sum(t - t0 for t, _ in pts) / n
        mean_y = sum(y for _, y in pts) / n
        var = sum((t - t0 - mean_t) ** 2 for t, _ in pts)
        cov = sum((t - t0 - mean_t) * (y - mean_y) for t, y in pts)
        slope = cov / var * 3600 if var > 0 else 0.0
        return LeakVerdict(slope, span, n, slope > self.threshold)
