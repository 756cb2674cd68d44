"""Alert lifecycle: one stable id per (stream, fault) while active; new / update / end.

Both tiers (keyword and LLM) feed one tracker, so a fault seen by both is one alert:
`source` says which tier raised it first, `sources` every tier that has seen it. A repeated
match of an active alert adds evidence and bumps its count; a second tier confirming a
segment already in the evidence adds its name to `sources` without counting the segment
twice. Updates are debounced (at most one per `debounce_s`, the latest state wins); an
alert ends after `quiet_end_s` without a match. Every event carries a per-alert sequence
number so consumers can drop redeliveries (id + seq).

Every alert carries the slow tier's verdict on it (`Review`): an alert the keyword tier
raised is `unreviewed` until the slow tier names the same fault on a line of the alert's
own (one it counted, or one said since it was raised); then it is `confirmed`, with the
slow tier's evidence line, its model and weights digest and the seconds from the alert's NEW
to the verdict, published at once in an `update` (not debounced). An alert the slow tier
raised itself is confirmed by that reading. A reading that does not name the fault changes
nothing: silence is not a dismissal.

Timers run on a monotonic clock (NTP may step a device's wall clock); `first_seen` and
`last_seen` are the audio's own epoch times, taken from the evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

__all__ = [
    "Alert",
    "AlertEvent",
    "AlertTiming",
    "AlertTracker",
    "EventType",
    "Evidence",
    "Observation",
    "Review",
    "ReviewState",
    "Reviewer",
]


_COUNTED = 1024  # segment numbers remembered per alert


class EventType(str, Enum):
    new = "new"
    update = "update"
    end = "end"


class AlertTiming(Protocol):
    """The per-stream timing the tracker needs (the daemon's AlertSettings fits)."""

    @property
    def debounce_s(self) -> float: ...
    @property
    def quiet_end_s(self) -> float: ...
    @property
    def max_evidence(self) -> int: ...


@dataclass(frozen=True)
class Evidence:
    text: str  # keyword tier: the new text of the segment; LLM tier: the segment it named
    start: float
    end: float
    seq: int
    source: str = "keyword"  # the tier that saw it (the tracker stamps it)
    confidence: float | None = None  # LLM tier: the engine's probability of the fault


_EVIDENCE_FIELDS = frozenset(Evidence.__dataclass_fields__)


def _evidence(data: dict[str, Any]) -> Evidence:
    """Evidence from its stored form; keys of older releases (the LLM's `note`, before
    answers pointed at lines) are left out."""
    return Evidence(**{k: v for k, v in data.items() if k in _EVIDENCE_FIELDS})


class ReviewState(str, Enum):
    unreviewed = "unreviewed"  # the slow tier has not named it (engine down, tier off, ...)
    confirmed = "confirmed"  # the slow tier named the same fault


@dataclass(frozen=True)
class Reviewer:
    """The model that signs a verdict: the engine's served folder name and weights digest."""

    model: str
    sha256: str | None = None  # None for random (dummy) weights


@dataclass(frozen=True)
class Review:
    """The slow tier's verdict on an alert."""

    state: ReviewState = ReviewState.unreviewed
    evidence: Evidence | None = None  # the line the slow tier pointed at
    model: str | None = None
    model_sha256: str | None = None
    after_s: float | None = None  # from the alert's NEW to the verdict (wall clock)

    def public(self) -> dict[str, Any]:
        return {
            "verdict": self.state.value,
            "verdict_evidence": None if self.evidence is None else asdict(self.evidence),
            "verdict_model": self.model,
            "verdict_model_sha256": self.model_sha256,
            "verdict_after_s": self.after_s,
        }

    @classmethod
    def from_public(cls, data: dict[str, Any]) -> Review:
        """From an alert's stored form; one stored before verdicts existed, or with a state
        this release does not know (a newer one's, after a rollback), is unreviewed."""
        evidence = data.get("verdict_evidence")
        known = {s.value for s in ReviewState}
        state = data.get("verdict")
        return cls(
            state=ReviewState(state) if state in known else ReviewState.unreviewed,
            evidence=None if evidence is None else _evidence(evidence),
            model=data.get("verdict_model"),
            model_sha256=data.get("verdict_model_sha256"),
            after_s=data.get("verdict_after_s"),
        )


@dataclass(frozen=True)
class Observation:
    """One detection of a fault, from either tier."""

    stream_id: str
    fault: str
    label: str
    severity: str
    source: str  # "keyword" | "llm"
    evidence: Evidence
    reviewer: Reviewer | None = None  # the slow tier: the model that read it


@dataclass
class Alert:
    id: str
    stream_id: str
    fault: str
    label: str
    severity: str
    source: str  # the tier that raised it
    evidence: list[Evidence]
    first_seen: float
    last_seen: float
    count: int
    event_seq: int = 0
    sources: list[str] = field(default_factory=list)  # every tier that has seen it
    raised_at: float | None = None  # wall time of its NEW (None: stored by an older release)
    review: Review = field(default_factory=Review)
    # Tracker bookkeeping on the monotonic clock; not part of the published alert.
    # Segments already counted, beyond the few kept as evidence: the LLM's window spans
    # hours, so it confirms segments whose evidence entry has long scrolled out.
    counted: dict[int, None] = field(default_factory=dict, compare=False)
    last_match_mono: float = field(default=0.0, compare=False)
    last_emit_mono: float = field(default=0.0, compare=False)
    dirty: bool = field(default=False, compare=False)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "stream_id": self.stream_id,
            "fault": self.fault,
            "label": self.label,
            "severity": self.severity,
            "source": self.source,
            "sources": self.sources or [self.source],
            "evidence": [asdict(e) for e in self.evidence],
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "count": self.count,
            "raised_at": self.raised_at,
            **self.review.public(),
        }

    @classmethod
    def from_public(cls, data: dict[str, Any], event_seq: int) -> Alert:
        return cls(
            id=data["id"],
            stream_id=data["stream_id"],
            fault=data["fault"],
            label=data["label"],
            severity=data["severity"],
            source=data["source"],
            evidence=[_evidence(e) for e in data["evidence"]],
            first_seen=data["first_seen"],
            last_seen=data["last_seen"],
            count=data["count"],
            event_seq=event_seq,
            sources=list(data.get("sources") or [data["source"]]),
            raised_at=data.get("raised_at"),
            review=Review.from_public(data),
        )


@dataclass(frozen=True)
class AlertEvent:
    type: EventType
    seq: int
    ts: float
    alert: dict[str, Any]
    reviewed: bool = False  # this event carries a new verdict (not part of the payload)

    @property
    def alert_id(self) -> str:
        return str(self.alert["id"])

    def payload(self) -> dict[str, Any]:
        return {"type": self.type.value, "seq": self.seq, "ts": self.ts, "alert": self.alert}


class AlertTracker:
    """Turns observations into lifecycle events. Not thread-safe: one owner task."""

    def __init__(
        self,
        timing_for: Callable[[str], AlertTiming],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._timing_for = timing_for
        self._mono = monotonic
        self._wall = wall
        self._active: dict[tuple[str, str], Alert] = {}
        self._last_id_ms = 0

    def restore(self, alerts: Iterable[Alert]) -> None:
        """Take back alerts that were active before a restart: their ids stay stable and
        their quiet timers start again now; one with a debounced update that had not been
        emitted (`dirty`) emits it at the next tick past its debounce."""
        now = self._mono()
        for alert in alerts:
            tail = alert.id.rsplit(":", 1)[-1]
            if tail.isdigit():
                self._last_id_ms = max(self._last_id_ms, int(tail))
            alert.last_match_mono = now
            alert.last_emit_mono = now
            self._active[(alert.stream_id, alert.fault)] = alert

    def active(self) -> list[Alert]:
        return list(self._active.values())

    def observe(self, obs: Observation) -> list[AlertEvent]:
        now = self._mono()
        evidence = replace(obs.evidence, source=obs.source)
        timing = self._timing_for(obs.stream_id)
        key = (obs.stream_id, obs.fault)
        alert = self._active.get(key)
        if alert is None:
            alert = Alert(
                id=f"{obs.stream_id}:{obs.fault}:{self._next_id_ms()}",
                stream_id=obs.stream_id,
                fault=obs.fault,
                label=obs.label,
                severity=obs.severity,
                source=obs.source,
                evidence=[evidence],
                first_seen=evidence.start,
                last_seen=evidence.end,
                count=1,
                last_match_mono=now,
                sources=[obs.source],
                counted={evidence.seq: None},
                raised_at=self._wall(),
            )
            if obs.source == "llm":  # raised by the reading that would confirm it
                alert.review = _confirmed(obs, evidence, after_s=0.0)
            self._active[key] = alert
            return [self._emit(alert, EventType.new, now)]
        verdict = self._review(alert, obs, evidence)
        new_source = obs.source not in alert.sources
        if new_source:
            alert.sources = [*alert.sources, obs.source]
        seen = evidence.seq in alert.counted or any(e.seq == evidence.seq for e in alert.evidence)
        alert.counted[evidence.seq] = None
        while len(alert.counted) > _COUNTED:
            del alert.counted[next(iter(alert.counted))]  # oldest first (insertion order)
        if seen:
            # The other tier confirming a segment already counted: one segment is one
            # match, whoever saw it; only the list of tiers (and the verdict) changes.
            if not new_source and not verdict:
                return []
            if not any(
                (e.seq, e.source) == (evidence.seq, evidence.source) for e in alert.evidence
            ):
                alert.evidence = [*alert.evidence, evidence][-timing.max_evidence :]
        else:
            alert.count += 1
            alert.evidence = [*alert.evidence, evidence][-timing.max_evidence :]
            alert.first_seen = min(alert.first_seen, evidence.start)
            alert.last_seen = max(alert.last_seen, evidence.end)
            alert.last_match_mono = now
        if verdict or now - alert.last_emit_mono >= timing.debounce_s:
            # a verdict is news: no debounce
            return [self._emit(alert, EventType.update, now, reviewed=verdict)]
        alert.dirty = True
        return []

    def _review(self, alert: Alert, obs: Observation, evidence: Evidence) -> bool:
        """Confirm an unreviewed alert the slow tier now names on a line of its own (one
        it counted, or one said since it was raised: not an older line of an alert of the
        same fault that has ended); whether the verdict changed. Called before the line is
        counted."""
        if obs.source != "llm" or alert.review.state is not ReviewState.unreviewed:
            return False
        if evidence.seq not in alert.counted and evidence.start < alert.first_seen:
            return False
        raised = alert.raised_at
        after = None if raised is None else round(max(0.0, self._wall() - raised), 3)
        alert.review = _confirmed(obs, evidence, after_s=after)
        return True

    def tick(self) -> list[AlertEvent]:
        """Flush debounced updates and end quiet alerts; call about once a second."""
        now = self._mono()
        events: list[AlertEvent] = []
        for key, alert in list(self._active.items()):
            timing = self._timing_for(alert.stream_id)
            if now - alert.last_match_mono >= timing.quiet_end_s:
                del self._active[key]
                events.append(self._emit(alert, EventType.end, now))
            elif alert.dirty and now - alert.last_emit_mono >= timing.debounce_s:
                events.append(self._emit(alert, EventType.update, now))
        return events

    def flush(self) -> list[AlertEvent]:
        """Emit every debounced update now (before a shutdown), whatever the debounce."""
        now = self._mono()
        return [self._emit(a, EventType.update, now) for a in self._active.values() if a.dirty]

    def _next_id_ms(self) -> int:
        # Strictly increasing: an alert raised again in the same millisecond, or after NTP
        # stepped the clock back, must not reuse an id (consumers dedupe by id + seq).
        self._last_id_ms = max(int(self._wall() * 1000), self._last_id_ms + 1)
        return self._last_id_ms

    def _emit(
        self, alert: Alert, kind: EventType, now: float, *, reviewed: bool = False
    ) -> AlertEvent:
        alert.event_seq += 1
        alert.last_emit_mono = now
        alert.dirty = False
        return AlertEvent(kind, alert.event_seq, self._wall(), alert.public(), reviewed)


def _confirmed(obs: Observation, evidence: Evidence, *, after_s: float | None) -> Review:
    who = obs.reviewer
    return Review(
        state=ReviewState.confirmed,
        evidence=evidence,
        model=None if who is None else who.model,
        model_sha256=None if who is None else who.sha256,
        after_s=after_s,
    )
