"""What the alert lifecycle produces and stores: alerts, their evidence, verdicts and events.

The tracker (pipelines/alerts.py) builds these; the outbox stores `Alert.public()` and reads
it back with `Alert.from_public`, and the publisher sends `AlertEvent.payload()`. The stored
form is forward- and backward-tolerant: keys an older release did not write read as their
defaults, keys a newer one wrote and this one does not know are left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Protocol

from pipelines.alarms import AlarmStatus, Operator

__all__ = [
    "Alert",
    "AlertEvent",
    "AlertTiming",
    "EventType",
    "Evidence",
    "Observation",
    "Review",
    "ReviewState",
    "Reviewer",
]


class EventType(str, Enum):
    new = "new"
    update = "update"
    end = "end"
    # An operator's command (or a shelf that ran out), as the audit trail: docs/alarms.md.
    ack = "ack"
    shelve = "shelve"
    unshelve = "unshelve"


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
    alarm: AlarmStatus = field(default_factory=AlarmStatus)
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
            "alarm": self.alarm.public(),
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
            alarm=AlarmStatus.from_public(data.get("alarm")),
        )


@dataclass(frozen=True)
class AlertEvent:
    type: EventType
    seq: int
    ts: float
    alert: dict[str, Any]
    reviewed: bool = False  # this event carries a new verdict (not part of the payload)
    reason: str | None = None  # end: cleared / suppressed
    operator: Operator | None = None  # ack / shelve / unshelve: who, when, why

    @property
    def alert_id(self) -> str:
        return str(self.alert["id"])

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": self.type.value, "seq": self.seq, "ts": self.ts, "alert": self.alert
        }  # fmt: skip
        if self.reason is not None:
            body["reason"] = self.reason
        if self.operator is not None:
            body["operator"] = self.operator.public()
        return body
