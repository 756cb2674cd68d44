"""Alarm states as a plant's alarm system keeps them (ISA-18.2 / IEC 62682).

An alert (pipelines/alerts.py) is a fault the tiers heard: raised, updated, ended when the
line goes quiet. Its alarm state is what the operator has done about it, orthogonal to that
lifecycle:

- `unack_active`: raised, nobody has acknowledged it yet;
- `ack_active`: an operator acknowledged it ("seen, on it"); the fault is still heard;
- `unack_cleared`: the fault went quiet before anyone acknowledged it: the alarm stands
  (the tracker keeps it beside the active ones) until someone does;
- `normal`: cleared and acknowledged: nothing left to do, the alarm leaves the list;
- `shelved`: an operator put it aside until a time (by whom, why): no event of it is
  published and a repeat raises no new alert; when the shelf ends it comes back
  `unack_active` if the fault is still heard, else `normal`;
- `suppressed_by_design`: the configuration switched the fault off for its stream
  (`streams.<id>.disabled_faults`): the alarm leaves the list.

`TRANSITIONS` is the whole machine, one row per (state, trigger); `step` is the only way a
state changes, and refuses what the table does not hold with an `AlarmRefused` that says
why. docs/alarms.md draws its diagram from this table (bench/alarms/draw_states.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

__all__ = [
    "LISTED",
    "TRANSITIONS",
    "Action",
    "AlarmCommand",
    "AlarmRefused",
    "AlarmState",
    "AlarmStatus",
    "Operator",
    "RefusalReason",
    "ShelvePolicy",
    "Trigger",
    "check_shelve",
    "step",
]


class AlarmState(str, Enum):
    unack_active = "unack_active"
    ack_active = "ack_active"
    unack_cleared = "unack_cleared"
    normal = "normal"
    shelved = "shelved"
    suppressed_by_design = "suppressed_by_design"


class Trigger(str, Enum):
    raise_ = "raise"  # the tiers raised the fault (a NEW)
    clear = "clear"  # the line went quiet (an END)
    ack = "ack"  # an operator acknowledged it
    shelve = "shelve"  # an operator shelved it
    unshelve = "unshelve"  # the shelf ended (operator or expiry), the fault still heard
    unshelve_quiet = "unshelve_quiet"  # the shelf ended and the fault is no longer heard
    suppress = "suppress"  # the configuration switched the fault off for the stream


S, T = AlarmState, Trigger
TRANSITIONS: Mapping[tuple[AlarmState, Trigger], AlarmState] = {
    (S.normal, T.raise_): S.unack_active,
    (S.unack_active, T.ack): S.ack_active,
    (S.unack_active, T.clear): S.unack_cleared,
    (S.ack_active, T.clear): S.normal,
    (S.unack_cleared, T.ack): S.normal,
    (S.unack_active, T.shelve): S.shelved,
    (S.ack_active, T.shelve): S.shelved,
    (S.shelved, T.unshelve): S.unack_active,
    (S.shelved, T.unshelve_quiet): S.normal,
    (S.unack_active, T.suppress): S.suppressed_by_design,
    (S.ack_active, T.suppress): S.suppressed_by_design,
    (S.unack_cleared, T.suppress): S.suppressed_by_design,
    (S.shelved, T.suppress): S.suppressed_by_design,
}
del S, T

# States that stay on the alarm list (a state not here has left it).
LISTED = frozenset(
    {AlarmState.unack_active, AlarmState.ack_active, AlarmState.unack_cleared, AlarmState.shelved}
)


class Action(str, Enum):
    """What an operator can ask (the command topics' last level, docs/alarms.md)."""

    ack = "ack"
    shelve = "shelve"
    unshelve = "unshelve"


class RefusalReason(str, Enum):
    unknown_alert = "unknown_alert"  # no such alert on the list (never raised, or gone)
    not_allowed = "not_allowed"  # the command does not apply in the alarm's state
    shelve_too_long = "shelve_too_long"  # past alarms.max_shelve_s
    critical_not_shelvable = "critical_not_shelvable"  # alarms.shelve_critical is false
    forbidden = "forbidden"  # the operator is not in alarms.operators
    invalid = "invalid"  # the command could not be read


class AlarmRefused(Exception):
    """A command or a step the state machine does not allow; `reason` is the class that
    `<prefix>/errors` and the counters carry."""

    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Operator:
    """Who did something to an alarm, when and why (the audit trail's line)."""

    action: str  # ack / shelve / unshelve, or "expired" for a shelf that ran out
    by: str
    at: float  # wall time
    note: str | None = None

    def public(self) -> dict[str, Any]:
        return {"action": self.action, "by": self.by, "at": self.at, "note": self.note}


@dataclass(frozen=True)
class AlarmCommand:
    """An operator's command, read and authorised by the service (agent/alarm_inbox.py)."""

    action: Action
    alert_id: str
    by: str
    at: float
    note: str | None = None
    for_s: float | None = None  # shelve: how long

    def operator(self) -> Operator:
        return Operator(self.action.value, self.by, self.at, self.note)


@dataclass(frozen=True)
class ShelvePolicy:
    """The configuration's limits on shelving (`alarms:`)."""

    max_shelve_s: float
    shelve_critical: bool = False


@dataclass(frozen=True)
class AlarmStatus:
    """An alert's alarm state and the operator actions that led to it."""

    state: AlarmState = AlarmState.unack_active
    acked_by: str | None = None
    acked_at: float | None = None
    shelved_by: str | None = None
    shelved_until: float | None = None  # wall time
    shelve_reason: str | None = None

    @property
    def listed(self) -> bool:
        return self.state in LISTED

    def public(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "acked_by": self.acked_by,
            "acked_at": self.acked_at,
            "shelved_by": self.shelved_by,
            "shelved_until": self.shelved_until,
            "shelve_reason": self.shelve_reason,
        }

    @classmethod
    def from_public(cls, data: Mapping[str, Any] | None) -> AlarmStatus:
        """From an alert's stored form: one stored before alarm states existed is
        unacknowledged and active; a state this release does not know (a newer one's,
        after a rollback) reads unacknowledged too, so nobody's alarm is lost."""
        if not data:
            return cls()
        known = {s.value for s in AlarmState}
        state = data.get("state")
        return cls(
            state=AlarmState(state) if state in known else AlarmState.unack_active,
            acked_by=data.get("acked_by"),
            acked_at=data.get("acked_at"),
            shelved_by=data.get("shelved_by"),
            shelved_until=data.get("shelved_until"),
            shelve_reason=data.get("shelve_reason"),
        )


def step(
    status: AlarmStatus,
    trigger: Trigger,
    who: Operator | None = None,
    *,
    until: float | None = None,
) -> AlarmStatus:
    """The state after `trigger`, with the operator's marks (an ack records who and when,
    a shelf who, why and `until` when; leaving the shelf clears them).

    Raises:
        AlarmRefused: the table has no row for (state, trigger) (`not_allowed`).
    """
    target = TRANSITIONS.get((status.state, trigger))
    if target is None:
        raise AlarmRefused(
            RefusalReason.not_allowed,
            f"cannot {trigger.value} an alarm that is {status.state.value}",
        )
    new = replace(status, state=target)
    if trigger is Trigger.ack and who is not None:
        new = replace(new, acked_by=who.by, acked_at=who.at)
    if trigger is Trigger.shelve and who is not None:
        new = replace(new, shelved_by=who.by, shelved_until=until, shelve_reason=who.note)
    if trigger in (Trigger.unshelve, Trigger.unshelve_quiet):
        # Back from the shelf unacknowledged: the fault may have changed while nobody looked.
        new = replace(new, shelved_by=None, shelved_until=None, shelve_reason=None)
        new = replace(new, acked_by=None, acked_at=None)
    return new


def check_shelve(command: AlarmCommand, severity: str, policy: ShelvePolicy) -> float:
    """The shelf's end (wall time) a shelve command asks for, within the policy.

    Raises:
        AlarmRefused: no or a non-positive duration (`invalid`), past `max_shelve_s`
            (`shelve_too_long`), a critical fault where `shelve_critical` is false.
    """
    if command.for_s is None or command.for_s <= 0:
        raise AlarmRefused(RefusalReason.invalid, "shelve needs for_s > 0 (seconds)")
    if command.for_s > policy.max_shelve_s:
        raise AlarmRefused(
            RefusalReason.shelve_too_long,
            f"for_s {command.for_s:g} is past alarms.max_shelve_s ({policy.max_shelve_s:g})",
        )
    if severity == "critical" and not policy.shelve_critical:
        raise AlarmRefused(
            RefusalReason.critical_not_shelvable,
            "a critical fault is not shelved (alarms.shelve_critical is false)",
        )
    return round(command.at + command.for_s, 3)
