"""agent/stats.py: the counters the status and /metrics share."""

from __future__ import annotations

from dataclasses import dataclass

from agent.stats import Stats
from pipelines.alerts import AlertEvent, AlertTracker, EventType, Evidence, Observation, Reviewer

WALL0 = 1_800_000_000.0


@dataclass(frozen=True)
class Timing:
    debounce_s: float = 0.0
    quiet_end_s: float = 60.0
    max_evidence: int = 5


def _obs(seq: int, source: str, fault: str = "leak") -> Observation:
    start = WALL0 + 5 * seq
    return Observation(
        stream_id="mic1",
        fault=fault,
        label=fault,
        severity="warning",
        source=source,
        evidence=Evidence(text=f"line {seq}", start=start, end=start + 5, seq=seq),
        reviewer=Reviewer("gemma3-270m+edge", "cd" * 32) if source == "llm" else None,
    )


def test_each_keyword_alert_counts_one_verdict() -> None:
    """A keyword alert counts once: `confirmed` (timed from its NEW) when the slow tier names
    it, else `unreviewed` when it ends; an alert the slow tier raised counts in neither."""
    clock = {"mono": 0.0, "wall": WALL0}
    tracker = AlertTracker(
        lambda _sid: Timing(), monotonic=lambda: clock["mono"], wall=lambda: clock["wall"]
    )
    stats = Stats()
    events: list[AlertEvent] = []

    def feed(new: list[AlertEvent]) -> None:
        for e in new:
            stats.alert_verdict(e.alert, reviewed=e.reviewed, ended=e.type is EventType.end)
        events.extend(new)

    feed(tracker.observe(_obs(1, "keyword", "leak")))  # confirmed below
    feed(tracker.observe(_obs(2, "keyword", "overheat")))  # never reviewed
    feed(tracker.observe(_obs(3, "llm", "bearing_noise")))  # raised by the slow tier
    clock["mono"] += 2.5
    clock["wall"] += 2.5
    feed(tracker.observe(_obs(1, "llm", "leak")))
    feed(tracker.observe(_obs(4, "keyword", "leak")))  # a later match: no second count
    assert stats.verdicts == {"confirmed": 1}
    assert stats.time_to_verdict.count == 1 and stats.time_to_verdict.last == 2.5
    clock["mono"] += 61
    feed(tracker.tick())
    assert {e.type for e in events[-3:]} == {EventType.end}
    assert stats.verdicts == {"confirmed": 1, "unreviewed": 1}
    snap = stats.snapshot()["alerts"]
    assert snap["verdicts"] == {"confirmed": 1, "unreviewed": 1}
    assert snap["time_to_verdict"] == {"count": 1, "p50_s": 2.5, "p95_s": 2.5}
