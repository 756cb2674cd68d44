"""The alarm list: every alert an operator still has to deal with, and their commands.

The tracker (pipelines/alerts.py) holds the active alerts, one per (stream, fault). An
alert that ended unacknowledged (`unack_cleared`) leaves the tracker, and a new one may be
raised for the same fault, but the alarm stands here, by id, until someone acknowledges it.
`absorb` takes such alarms out of the tracker's events; `command` applies an operator's ack,
shelve or unshelve to the alarm it names, active or standing, and returns its audit event;
`suppress` ends the alarms of faults the configuration has switched off. The list is
bounded (`max_standing`): past it the oldest standing alarm is dropped, counted and logged.

Not thread-safe: the keyword stage calls it under its lock (pipelines/keyword_stage.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from pipelines.alarms import (
    Action,
    AlarmCommand,
    AlarmRefused,
    AlarmState,
    RefusalReason,
    ShelvePolicy,
    Trigger,
    check_shelve,
    step,
)
from pipelines.alerts import Alert, AlertEvent, AlertTracker, EventType

__all__ = ["AlarmList", "StandingChanges"]

log = structlog.get_logger(__name__)


@dataclass
class StandingChanges:
    """What a batch changed in the standing alarms (stored with the batch's events)."""

    upserts: list[Alert] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)  # alert ids

    def __bool__(self) -> bool:
        return bool(self.upserts or self.deletes)


class AlarmList:
    def __init__(
        self,
        tracker: AlertTracker,
        policy: Callable[[], ShelvePolicy],
        max_standing: Callable[[], int],
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`policy` and `max_standing` are asked at each use (a fleet apply may change
        them)."""
        self._tracker = tracker
        self._policy = policy
        self._max_standing = max_standing
        self._wall = wall
        self._standing: dict[str, Alert] = {}  # id -> alarm, oldest first
        self.dropped = 0  # standing alarms dropped past max_standing

    def restore(self, standing: Iterable[Alert]) -> None:
        for alert in sorted(standing, key=lambda a: a.raised_at or 0.0):
            self._standing[alert.id] = alert

    def standing(self) -> list[Alert]:
        return list(self._standing.values())

    def listed(self) -> list[Alert]:
        """Every alarm on the list: the active alerts, then the standing ones."""
        return [*self._tracker.active(), *self._standing.values()]

    def absorb(self, events: Sequence[AlertEvent]) -> StandingChanges:
        """Alarms that ended unacknowledged stand from now on (bounded)."""
        changes = StandingChanges()
        for event in events:
            if event.type is EventType.end:
                alarm = event.alert.get("alarm") or {}
                if alarm.get("state") == AlarmState.unack_cleared.value:
                    alert = Alert.from_public(event.alert, event.seq)
                    self._standing[alert.id] = alert
                    changes.upserts.append(alert)
        while len(self._standing) > max(0, self._max_standing()):
            oldest = next(iter(self._standing))
            del self._standing[oldest]
            self.dropped += 1
            changes.deletes.append(oldest)
            changes.upserts = [a for a in changes.upserts if a.id != oldest]
            log.warning(
                "alarm.standing_dropped",
                alert_id=oldest,
                bound=self._max_standing(),
                dropped=self.dropped,
            )
        return changes

    def command(self, cmd: AlarmCommand) -> tuple[list[AlertEvent], StandingChanges]:
        """An operator's command on the alarm it names: its audit event(s), and what it
        changed in the standing alarms.

        Raises:
            AlarmRefused: no such alarm on the list (`unknown_alert`), or the command does
                not apply to it; nothing changed.
        """
        who = cmd.operator()
        active = self._tracker.find(cmd.alert_id)
        if active is not None:
            if cmd.action is Action.ack:
                return [self._tracker.command(active, Trigger.ack, who)], StandingChanges()
            if cmd.action is Action.shelve:
                if active.alarm.state is AlarmState.shelved:
                    raise AlarmRefused(RefusalReason.not_allowed, "already shelved")
                until = check_shelve(cmd, active.severity, self._policy())
                event = self._tracker.command(active, Trigger.shelve, who, until=until)
                return [event], StandingChanges()
            if active.alarm.state is not AlarmState.shelved:
                raise AlarmRefused(RefusalReason.not_allowed, "not shelved")
            return self._tracker.unshelve(active, who), StandingChanges()
        alert = self._standing.get(cmd.alert_id)
        if alert is None:
            raise AlarmRefused(
                RefusalReason.unknown_alert,
                f"no alarm {cmd.alert_id!r} on the list (never raised, or cleared and "
                "acknowledged)",
            )
        if cmd.action is not Action.ack:
            raise AlarmRefused(
                RefusalReason.not_allowed,
                f"the alarm has cleared: it can only be acknowledged, not {cmd.action.value}d",
            )
        alert.alarm = step(alert.alarm, Trigger.ack, who)
        del self._standing[alert.id]
        return [self._event(alert, EventType.ack, cmd)], StandingChanges(deletes=[alert.id])

    def suppress(
        self, disabled: Callable[[str, str], bool]
    ) -> tuple[list[AlertEvent], StandingChanges]:
        """End the alarms of (stream, fault) pairs the configuration switched off."""
        off = [a for a in self._tracker.active() if disabled(a.stream_id, a.fault)]
        events = [self._tracker.suppress(a) for a in off]
        changes = StandingChanges()
        for alert in [a for a in self._standing.values() if disabled(a.stream_id, a.fault)]:
            alert.alarm = step(alert.alarm, Trigger.suppress)
            del self._standing[alert.id]
            alert.event_seq += 1
            events.append(
                AlertEvent(
                    EventType.update,
                    alert.event_seq,
                    self._wall(),
                    alert.public(),
                    reason="suppressed",
                )
            )
            changes.deletes.append(alert.id)
        return events, changes

    def _event(self, alert: Alert, kind: EventType, cmd: AlarmCommand) -> AlertEvent:
        alert.event_seq += 1
        return AlertEvent(
            kind, alert.event_seq, self._wall(), alert.public(), operator=cmd.operator()
        )
