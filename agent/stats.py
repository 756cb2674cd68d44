"""Counters of everything the daemon accepts, drops and sends: one snapshot, many readers.

The same snapshot feeds the retained `<prefix>/status` topic and `agentctl status` (through
the control socket) now, and Prometheus later, so the three never disagree.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Stats", "StreamStats"]


@dataclass
class StreamStats:
    segments: int = 0
    duplicates: int = 0
    last_segment_mono: float | None = None


@dataclass
class Stats:
    started_mono: float = field(default_factory=time.monotonic)
    mqtt_connected: bool = False
    mqtt_connects: int = 0
    mqtt_disconnects: int = 0
    received: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    ingest_shed: int = 0
    detect_errors: int = 0
    keyword_matches: int = 0
    llm_faults: int = 0
    alert_events: Counter[str] = field(default_factory=Counter)
    published: int = 0
    publish_failures: int = 0
    errors_reported: int = 0
    errors_suppressed: int = 0
    streams: dict[str, StreamStats] = field(default_factory=dict)

    def stream(self, stream_id: str) -> StreamStats:
        return self.streams.setdefault(stream_id, StreamStats())

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "uptime_s": round(now - self.started_mono, 1),
            "mqtt": {
                "connected": self.mqtt_connected,
                "connects": self.mqtt_connects,
                "disconnects": self.mqtt_disconnects,
            },
            "ingest": {
                "received": self.received,
                "accepted": self.accepted,
                "rejected": dict(self.rejected),
                "duplicates": dict(self.duplicates),
                "shed": self.ingest_shed,
            },
            "detect": {
                "keyword_matches": self.keyword_matches,
                "llm_faults": self.llm_faults,
                "errors": self.detect_errors,
            },
            "alerts": {
                "events": dict(self.alert_events),
                "published": self.published,
                "publish_failures": self.publish_failures,
            },
            "errors": {"reported": self.errors_reported, "suppressed": self.errors_suppressed},
            "streams": {
                sid: {
                    "segments": s.segments,
                    "duplicates": s.duplicates,
                    "last_segment_age_s": None
                    if s.last_segment_mono is None
                    else round(now - s.last_segment_mono, 1),
                }
                for sid, s in sorted(self.streams.items())
            },
            **extra,
        }
