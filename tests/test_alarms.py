"""ISA-18.2 alarm states (pipelines/alarms.py) and the alarm list (pipelines/alarm_list.py)
over the real tracker, on injected clocks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipelines.alarm_list import AlarmList
from pipelines.alarms import (
    TRANSITIONS,
    Action,
    AlarmCommand,
    AlarmRefused,
    AlarmState,
    AlarmStatus,
    Operator,
    RefusalReason,
    ShelvePolicy,
    Trigger,
    check_shelve,
    step,
)
from pipelines.alerts import Alert, AlertEvent, AlertTracker, EventType, Evidence, Observation

WALL0 = 1_700_000_000.0
QUIET_S = 120.0


@dataclass(frozen=True)
class Timing:
    debounce_s: float = 10.0
    quiet_end_s: float = QUIET_S
    max_evidence: int = 5


class Clocks:
    def __init__(self) -> None:
        self.mono = 500.0
        self.wall = WALL0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


class Desk:
    """The real tracker and alarm list, as the keyword stage holds them."""

    def __init__(self, *, max_standing: int = 256, policy: ShelvePolicy | None = None) -> None:
        self.clocks = Clocks()
        self.tracker = AlertTracker(
            lambda _sid: Timing(), monotonic=lambda: self.clocks.mono, wall=lambda: self.clocks.wall
        )
        rules = policy or ShelvePolicy(max_shelve_s=8 * 3600)
        self.alarms = AlarmList(
            self.tracker, lambda: rules, lambda: max_standing, wall=lambda: self.clocks.wall
        )

    def hear(
        self, seq: int, fault: str = "bearing_noise", severity: str = "warning"
    ) -> list[AlertEvent]:
        t = self.clocks.wall
        return self.tracker.observe(
            Observation(
                stream_id="mic1", fault=fault, label=fault, severity=severity, source="keyword",
                evidence=Evidence(text=f"{fault} {seq}", start=t, end=t + 1, seq=seq),
            )
        )  # fmt: skip

    def tick(self) -> list[AlertEvent]:
        events = self.tracker.tick()
        self.alarms.absorb(events)
        return events

    def cmd(self, action: Action, alert_id: str, *, for_s: float | None = None,
            note: str | None = None) -> list[AlertEvent]:  # fmt: skip
        events, _ = self.alarms.command(
            AlarmCommand(action, alert_id, "alice", self.clocks.wall, note, for_s)
        )
        self.alarms.absorb(events)
        return events


def state_of(event: AlertEvent) -> str:
    return str(event.alert["alarm"]["state"])


# -- the table --------------------------------------------------------------------------------


def test_every_state_is_reached_and_only_listed_states_can_be_commanded() -> None:
    targets = set(TRANSITIONS.values())
    assert targets | {AlarmState.normal} == set(AlarmState)
    # The terminal states have no way out.
    for terminal in (AlarmState.normal, AlarmState.suppressed_by_design):
        assert all(src is not terminal or trig is Trigger.raise_ for src, trig in TRANSITIONS)
    assert {src for src, trig in TRANSITIONS if trig is Trigger.ack} == {
        AlarmState.unack_active, AlarmState.unack_cleared
    }  # fmt: skip


def test_a_step_the_table_does_not_hold_is_refused_with_its_reason() -> None:
    acked = step(AlarmStatus(), Trigger.ack, Operator("ack", "bob", WALL0))
    assert acked.state is AlarmState.ack_active and acked.acked_by == "bob"
    with pytest.raises(AlarmRefused) as err:
        step(acked, Trigger.ack, Operator("ack", "bob", WALL0))
    assert err.value.reason is RefusalReason.not_allowed
    assert "ack_active" in err.value.detail


def test_leaving_the_shelf_clears_its_marks_and_the_old_ack() -> None:
    who = Operator("shelve", "carol", WALL0, "sensor being replaced")
    acked = step(AlarmStatus(), Trigger.ack, who)
    shelved = step(acked, Trigger.shelve, who, until=WALL0 + 60)
    assert (shelved.shelved_by, shelved.shelved_until, shelved.shelve_reason) == (
        "carol", WALL0 + 60, "sensor being replaced"
    )  # fmt: skip
    back = step(shelved, Trigger.unshelve, who)
    assert back.state is AlarmState.unack_active
    assert (back.shelved_until, back.acked_by) == (None, None)


def test_a_shelf_is_bounded_and_critical_faults_are_not_shelved_by_default() -> None:
    policy = ShelvePolicy(max_shelve_s=3600)
    ask = AlarmCommand(Action.shelve, "a", "alice", WALL0, "nuisance", 7200)
    with pytest.raises(AlarmRefused) as err:
        check_shelve(ask, "warning", policy)
    assert err.value.reason is RefusalReason.shelve_too_long
    ok = AlarmCommand(Action.shelve, "a", "alice", WALL0, "nuisance", 600)
    assert check_shelve(ok, "warning", policy) == WALL0 + 600
    with pytest.raises(AlarmRefused) as err:
        check_shelve(ok, "critical", policy)
    assert err.value.reason is RefusalReason.critical_not_shelvable
    assert check_shelve(ok, "critical", ShelvePolicy(3600, shelve_critical=True)) == WALL0 + 600
    with pytest.raises(AlarmRefused) as err:
        check_shelve(AlarmCommand(Action.shelve, "a", "alice", WALL0), "warning", policy)
    assert err.value.reason is RefusalReason.invalid


def test_a_stored_alarm_of_an_older_or_newer_release_reads_unacknowledged() -> None:
    assert AlarmStatus.from_public(None).state is AlarmState.unack_active
    assert AlarmStatus.from_public({"state": "escalated"}).state is AlarmState.unack_active
    kept = AlarmStatus(AlarmState.shelved, shelved_by="x", shelved_until=WALL0 + 5)
    assert AlarmStatus.from_public(kept.public()) == kept


# -- over the tracker -------------------------------------------------------------------------


def test_raised_acknowledged_cleared() -> None:
    desk = Desk()
    (new,) = desk.hear(1)
    assert new.type is EventType.new and state_of(new) == "unack_active"
    (ack,) = desk.cmd(Action.ack, new.alert_id, note="on my way")
    assert ack.type is EventType.ack and state_of(ack) == "ack_active"
    assert ack.payload()["operator"] == {
        "action": "ack", "by": "alice", "at": WALL0, "note": "on my way"
    }  # fmt: skip
    assert ack.seq == new.seq + 1
    desk.clocks.advance(QUIET_S)
    (end,) = desk.tick()
    assert end.type is EventType.end and state_of(end) == "normal"
    assert end.payload()["reason"] == "cleared"
    assert desk.alarms.listed() == []


def test_a_fault_that_clears_unacknowledged_stands_until_acknowledged() -> None:
    desk = Desk()
    (new,) = desk.hear(1)
    desk.clocks.advance(QUIET_S)
    (end,) = desk.tick()
    assert state_of(end) == "unack_cleared"
    assert [a.id for a in desk.alarms.standing()] == [new.alert_id]
    # The fault comes back: a new alert of its own, the old alarm still stands.
    (again,) = desk.hear(2)
    assert again.type is EventType.new and again.alert_id != new.alert_id
    assert len(desk.alarms.listed()) == 2
    with pytest.raises(AlarmRefused) as err:
        desk.cmd(Action.shelve, new.alert_id, for_s=60)
    assert err.value.reason is RefusalReason.not_allowed
    (ack,) = desk.cmd(Action.ack, new.alert_id)
    assert ack.type is EventType.ack and state_of(ack) == "normal"
    assert ack.seq == end.seq + 1
    assert desk.alarms.standing() == []
    with pytest.raises(AlarmRefused) as err:
        desk.cmd(Action.ack, new.alert_id)
    assert err.value.reason is RefusalReason.unknown_alert


def test_a_shelved_alert_is_quiet_for_its_time_and_comes_back_while_heard() -> None:
    desk = Desk()
    (new,) = desk.hear(1)
    (shelve,) = desk.cmd(Action.shelve, new.alert_id, for_s=600, note="belt being fixed")
    assert shelve.type is EventType.shelve and state_of(shelve) == "shelved"
    assert shelve.alert["alarm"]["shelved_until"] == WALL0 + 600
    for n in range(2, 12):  # heard every minute: counted, nothing published, no new alert
        desk.clocks.advance(55)
        assert desk.hear(n) == []
        assert desk.tick() == []
    desk.clocks.advance(600 - 55 * 10)
    (back,) = desk.tick()
    assert back.type is EventType.unshelve and state_of(back) == "unack_active"
    assert back.payload()["operator"]["action"] == "expired"
    assert back.alert["count"] == 11  # what was heard on the shelf is in the alert
    assert back.alert_id == new.alert_id and back.seq == shelve.seq + 1


def test_a_shelf_that_ends_after_the_fault_went_quiet_ends_the_alert() -> None:
    desk = Desk()
    (new,) = desk.hear(1)
    desk.cmd(Action.shelve, new.alert_id, for_s=3600)
    desk.clocks.advance(QUIET_S * 2)
    assert desk.tick() == []  # quiet, but shelved: no END while on the shelf
    (unshelve, end) = desk.cmd(Action.unshelve, new.alert_id, note="fixed")
    assert unshelve.type is EventType.unshelve and end.type is EventType.end
    assert state_of(end) == "normal" and desk.alarms.listed() == []


def test_commands_that_do_not_apply_change_nothing() -> None:
    desk = Desk()
    (new,) = desk.hear(1)
    for action in (Action.unshelve,):
        with pytest.raises(AlarmRefused):
            desk.cmd(action, new.alert_id)
    with pytest.raises(AlarmRefused) as err:
        desk.cmd(Action.ack, "mic1:bearing_noise:1")
    assert err.value.reason is RefusalReason.unknown_alert
    desk.cmd(Action.shelve, new.alert_id, for_s=60)
    with pytest.raises(AlarmRefused):
        desk.cmd(Action.shelve, new.alert_id, for_s=60)
    with pytest.raises(AlarmRefused):
        desk.cmd(Action.ack, new.alert_id)  # shelved: unshelve it first
    (alert,) = desk.tracker.active()
    assert alert.alarm.state is AlarmState.shelved and alert.event_seq == 2


def test_a_critical_fault_is_not_shelved() -> None:
    desk = Desk()
    (new,) = desk.hear(1, fault="fire", severity="critical")
    with pytest.raises(AlarmRefused) as err:
        desk.cmd(Action.shelve, new.alert_id, for_s=60)
    assert err.value.reason is RefusalReason.critical_not_shelvable
    assert desk.tracker.active()[0].alarm.state is AlarmState.unack_active


def test_standing_alarms_are_bounded_oldest_first() -> None:
    desk = Desk(max_standing=2)
    ids = []
    for n in range(3):
        (new,) = desk.hear(n, fault=f"fault{n}")
        ids.append(new.alert_id)
        desk.clocks.advance(QUIET_S)
        desk.tick()
    assert [a.id for a in desk.alarms.standing()] == ids[1:]
    assert desk.alarms.dropped == 1


def test_a_fault_the_configuration_switches_off_is_suppressed_by_design() -> None:
    desk = Desk()
    (active,) = desk.hear(1, fault="belt_slip")
    (standing,) = desk.hear(2, fault="bearing_noise")
    desk.cmd(Action.ack, active.alert_id)
    desk.clocks.advance(60)
    desk.hear(3, fault="belt_slip")  # keeps belt_slip heard
    desk.clocks.advance(QUIET_S - 60)
    assert [e.alert["fault"] for e in desk.tick()] == ["bearing_noise"]  # now standing
    events, changes = desk.alarms.suppress(lambda _sid, _fault: True)
    assert {(e.alert["fault"], e.type, e.payload()["reason"]) for e in events} == {
        ("belt_slip", EventType.end, "suppressed"),
        ("bearing_noise", EventType.update, "suppressed"),
    }
    assert all(state_of(e) == "suppressed_by_design" for e in events)
    assert changes.deletes == [standing.alert_id]
    assert desk.alarms.listed() == []


def test_alarm_state_survives_the_stored_form() -> None:
    desk = Desk()
    (new,) = desk.hear(1)
    desk.cmd(Action.shelve, new.alert_id, for_s=600)
    (alert,) = desk.tracker.active()
    back = Alert.from_public(alert.public(), alert.event_seq)
    assert back.alarm == alert.alarm and back.alarm.state is AlarmState.shelved


def test_the_documented_table_is_the_state_machine_and_the_diagram_draws_every_row() -> None:
    from pathlib import Path

    from bench.alarms.draw_states import PLACES, edges

    doc = (Path(__file__).resolve().parents[1] / "docs" / "alarms.md").read_text()
    rows = set()
    for line in doc.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] in {t.value for t in Trigger}:
            rows.add((AlarmState(cells[0]), Trigger(cells[1]), AlarmState(cells[2])))
    assert rows == {(src, trig, dst) for (src, trig), dst in TRANSITIONS.items()}
    assert set(edges()) == rows
    assert {s for e in edges() for s in (e[0], e[2])} <= PLACES.keys()
