"""Rejected input goes to `<prefix>/errors`: one JSON event each, rate-limited.

A misbehaving publisher can send thousands of bad payloads a second; reporting each would
turn our error topic into its amplifier. A token bucket allows `per_minute` reports (with a
burst of the same size); the rest are counted as suppressed, and every event carries the
running suppressed count so a reader knows what was not shown.
"""

from __future__ import annotations

import json
import time

import structlog

from agent.mqtt import MqttLink, NotConnectedError
from agent.stats import Stats
from pipelines.queues import SheddingQueue

__all__ = ["ErrorReporter"]

log = structlog.get_logger(__name__)


class ErrorReporter:
    def __init__(self, topic: str, per_minute: int, stats: Stats) -> None:
        """Built before the broker link (the intake reports through it); `run()` publishes
        on the link."""
        self._topic = topic
        self._rate = per_minute / 60.0
        self._capacity = float(per_minute)
        self._tokens = float(per_minute)
        self._refilled = time.monotonic()
        self._stats = stats
        self._queue: SheddingQueue[bytes] = SheddingQueue(100)

    def report(self, topic: str, reason: str, size: int, detail: str) -> None:
        """Count and log every rejection; publish it if the rate allows."""
        log.warning("input.rejected", topic=topic, reason=reason, size=size, detail=detail)
        now = time.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1.0:
            self._stats.errors_suppressed += 1
            return
        self._tokens -= 1.0
        self._stats.errors_reported += 1
        event = {
            "ts": time.time(),
            "topic": topic,
            "reason": reason,
            "size": size,
            "detail": detail,
            "suppressed_total": self._stats.errors_suppressed,
        }
        if self._queue.put(json.dumps(event, ensure_ascii=False).encode()) is not None:
            self._stats.errors_suppressed += 1

    async def run(self, link: MqttLink) -> None:
        while True:
            payload = await self._queue.get()
            await link.connected.wait()
            try:
                await link.publish(self._topic, payload, qos=1)
            except NotConnectedError:
                self._stats.errors_suppressed += 1  # best effort: errors are not durable
