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

Every alert also carries its alarm state (pipelines/alarms.py, ISA-18.2): raised
`unack_active`; at its END `unack_cleared` if nobody acknowledged it (the alarm list,
pipelines/alarm_list.py, keeps it until someone does) or `normal`. A shelved alert publishes
nothing, not even its END, until the shelf ends (`tick`): then it comes back
`unack_active` if the fault was heard within `quiet_end_s`, or ends.

Timers run on a monotonic clock (NTP may step a device's wall clock); `first_seen` and
`last_seen` are the audio's own epoch times, taken from the evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from pipelines.alarms import AlarmState, Operator, Trigger, step
from pipelines.alert_record import (
    Alert,
    AlertEvent,
    AlertTiming,
    EventType,
    Evidence,
    Observation,
    Review,
    Reviewer,
    ReviewState,
)

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
        if alert.alarm.state is AlarmState.shelved:
            alert.dirty = True  # kept (and stored), published when the shelf ends
            return []
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
            if alert.alarm.state is AlarmState.shelved:
                until = alert.alarm.shelved_until
                if until is not None and self._wall() >= until:
                    by = Operator("expired", "shelf", round(self._wall(), 3))
                    events += self.unshelve(alert, by)
            elif now - alert.last_match_mono >= timing.quiet_end_s:
                del self._active[key]
                alert.alarm = step(alert.alarm, Trigger.clear)
                events.append(self._emit(alert, EventType.end, now, reason="cleared"))
            elif alert.dirty and now - alert.last_emit_mono >= timing.debounce_s:
                events.append(self._emit(alert, EventType.update, now))
        return events

    def flush(self) -> list[AlertEvent]:
        """Emit every debounced update now (before a shutdown), whatever the debounce; a
        shelved alert's wait for its shelf."""
        now = self._mono()
        return [
            self._emit(a, EventType.update, now)
            for a in self._active.values()
            if a.dirty and a.alarm.state is not AlarmState.shelved
        ]

    # -- operator commands and the configuration (pipelines/alarm_list.py drives these) --

    def find(self, alert_id: str) -> Alert | None:
        """The active alert with this id (a shelved one included)."""
        return next((a for a in self._active.values() if a.id == alert_id), None)

    def heard(self, alert: Alert) -> bool:
        """Whether its fault was matched within `quiet_end_s` (the condition is present)."""
        timing = self._timing_for(alert.stream_id)
        return self._mono() - alert.last_match_mono < timing.quiet_end_s

    def command(
        self, alert: Alert, trigger: Trigger, who: Operator, *, until: float | None = None
    ) -> AlertEvent:
        """An operator's ack or shelve of an active alert, as its audit event.

        Raises:
            AlarmRefused: not allowed in the alarm's state (nothing changed).
        """
        alert.alarm = step(alert.alarm, trigger, who, until=until)
        kind = EventType.ack if trigger is Trigger.ack else EventType.shelve
        alert.dirty = False  # what was pending goes out in this event
        return self._emit(alert, kind, self._mono(), operator=who)

    def unshelve(self, alert: Alert, who: Operator) -> list[AlertEvent]:
        """Off the shelf (an operator, or its time ran out): back `unack_active` if the
        fault is still heard, else `normal` and ended.

        Raises:
            AlarmRefused: the alert is not shelved.
        """
        now = self._mono()
        if not self.heard(alert):
            alert.alarm = step(alert.alarm, Trigger.unshelve_quiet, who)
            del self._active[(alert.stream_id, alert.fault)]
            return [
                self._emit(alert, EventType.unshelve, now, operator=who),
                self._emit(alert, EventType.end, now, reason="cleared"),
            ]
        alert.alarm = step(alert.alarm, Trigger.unshelve, who)
        return [self._emit(alert, EventType.unshelve, now, operator=who)]

    def suppress(self, alert: Alert) -> AlertEvent:
        """The configuration switched its fault off for the stream: it ends now."""
        alert.alarm = step(alert.alarm, Trigger.suppress)
        del self._active[(alert.stream_id, alert.fault)]
        return self._emit(alert, EventType.end, self._mono(), reason="suppressed")

    def _next_id_ms(self) -> int:
        # Strictly increasing: an alert raised again in the same millisecond, or after NTP
        # stepped the clock back, must not reuse an id (consumers dedupe by id + seq).
        self._last_id_ms = max(int(self._wall() * 1000), self._last_id_ms + 1)
        return self._last_id_ms

    def _emit(
        self,
        alert: Alert,
        kind: EventType,
        now: float,
        *,
        reviewed: bool = False,
        reason: str | None = None,
        operator: Operator | None = None,
    ) -> AlertEvent:
        alert.event_seq += 1
        alert.last_emit_mono = now
        alert.dirty = False
        return AlertEvent(
            kind, alert.event_seq, self._wall(), alert.public(), reviewed, reason, operator
        )


def _confirmed(obs: Observation, evidence: Evidence, *, after_s: float | None) -> Review:
    who = obs.reviewer
    return Review(
        state=ReviewState.confirmed,
        evidence=evidence,
        model=None if who is None else who.model,
        model_sha256=None if who is None else who.sha256,
        after_s=after_s,
    )
