"""Counters of everything the daemon accepts, drops and sends: one snapshot, many readers.

The same snapshot feeds the retained `<prefix>/status` topic, `agentctl status` (through
the control socket) and Prometheus' `/metrics` (agent.metrics), so the three never disagree.
Latencies are `LatencyWindow`s: percentiles here, histograms there, from the same values.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.latency import VERDICT_BUCKETS_S, LatencyWindow

__all__ = ["ALERT_SOURCES", "Stats", "StreamStats", "latency_summary"]

ALERT_SOURCES = ("keyword", "llm")
# Arrival times kept per stream, to time the alert a segment raises. An LLM alert points at
# a line of the rolling context, usually a recent one; an older line is not timed.
_ARRIVALS_PER_STREAM = 1024


@dataclass
class StreamStats:
    segments: int = 0
    duplicates: int = 0
    last_segment_mono: float | None = None
    arrivals: OrderedDict[int, float] = field(default_factory=OrderedDict)  # seq -> monotonic


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
    alerts_by_fault: Counter[str] = field(default_factory=Counter)  # `new` alerts per fault
    # Segment received -> the `new` alert it raised committed to the outbox, per source.
    segment_to_alert: dict[str, LatencyWindow] = field(
        default_factory=lambda: {source: LatencyWindow() for source in ALERT_SOURCES}
    )
    # Keyword alerts by the slow tier's verdict: `confirmed` when it came, `unreviewed` when
    # the alert ended without one; and the seconds from NEW to the verdict.
    verdicts: Counter[str] = field(default_factory=Counter)
    time_to_verdict: LatencyWindow = field(
        default_factory=lambda: LatencyWindow(buckets=VERDICT_BUCKETS_S)
    )
    published: int = 0
    publish_failures: int = 0
    publish_refused: Counter[str] = field(default_factory=Counter)  # by reason (MQTT 5)
    last_publish_refusal: str | None = None
    errors_reported: int = 0
    errors_suppressed: int = 0
    streams: dict[str, StreamStats] = field(default_factory=dict)

    def stream(self, stream_id: str) -> StreamStats:
        return self.streams.setdefault(stream_id, StreamStats())

    def arrived(self, stream_id: str, seq: int, at: float | None = None) -> None:
        """An accepted segment's arrival (monotonic), for `alert_raised`; `at`: when the
        audio it was transcribed from arrived."""
        arrivals = self.stream(stream_id).arrivals
        arrivals[seq] = time.monotonic() if at is None else at
        while len(arrivals) > _ARRIVALS_PER_STREAM:
            arrivals.popitem(last=False)

    def alert_raised(self, stream_id: str, seq: int | None, fault: str, source: str) -> None:
        """A `new` alert: counted per fault (an LLM's free `other:<label>` counts as
        `other`, so the label set stays the catalogue's) and timed from the segment that
        raised it (`seq`, its newest evidence) to now."""
        self.alerts_by_fault[fault.split(":", 1)[0]] += 1
        stream = self.streams.get(stream_id)
        arrived = stream.arrivals.get(seq) if stream is not None and seq is not None else None
        if arrived is not None and source in self.segment_to_alert:
            self.segment_to_alert[source].add(time.monotonic() - arrived)

    def alert_verdict(self, alert: Mapping[str, Any], *, reviewed: bool, ended: bool) -> None:
        """Count a keyword alert's verdict once: when it arrives (`reviewed`), or as
        `unreviewed` when the alert ends without one."""
        if alert.get("source") != "keyword":
            return
        verdict = alert.get("verdict") or "unreviewed"
        if reviewed:
            self.verdicts[verdict] += 1
            if (after := alert.get("verdict_after_s")) is not None:
                self.time_to_verdict.add(float(after))
        elif ended and verdict == "unreviewed":
            self.verdicts["unreviewed"] += 1

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
                "publish_refused": dict(self.publish_refused),
                "last_refusal": self.last_publish_refusal,
                "by_fault": dict(self.alerts_by_fault),
                "verdicts": {"confirmed": 0, "unreviewed": 0, **self.verdicts},
                "time_to_verdict": latency_summary(self.time_to_verdict),
                "segment_to_alert": {
                    source: latency_summary(w) for source, w in self.segment_to_alert.items()
                },
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


def latency_summary(window: LatencyWindow) -> dict[str, Any]:
    """What the status shows of a latency: count and recent p50/p95 (ms precision)."""
    p50, p95 = window.percentile(0.50), window.percentile(0.95)
    return {
        "count": window.count,
        "p50_s": None if p50 is None else round(p50, 3),
        "p95_s": None if p95 is None else round(p95, 3),
    }
