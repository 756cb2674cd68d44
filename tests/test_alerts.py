"""The alert lifecycle (pipelines/alerts.py) on injected clocks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipelines.alerts import (
    Alert,
    AlertEvent,
    AlertTracker,
    EventType,
    Evidence,
    Observation,
    Reviewer,
    ReviewState,
)

WALL0 = 1_700_000_000.0


@dataclass(frozen=True)
class Timing:
    debounce_s: float = 10.0
    quiet_end_s: float = 120.0
    max_evidence: int = 5


class Clocks:
    """A monotonic and a wall clock that move only when told to."""

    def __init__(self) -> None:
        self.mono = 500.0
        self.wall = WALL0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def make_tracker(clocks: Clocks, timing: Timing | None = None) -> AlertTracker:
    t = timing or Timing()
    return AlertTracker(lambda _stream: t, monotonic=lambda: clocks.mono, wall=lambda: clocks.wall)


def obs(
    seq: int,
    *,
    stream: str = "mic1",
    fault: str = "bearing_noise",
    source: str = "keyword",
    text: str = "bearing noise",
    reviewer: Reviewer | None = None,
) -> Observation:
    start = WALL0 + 5.0 * seq
    return Observation(
        stream_id=stream,
        fault=fault,
        label="bearing abnormal noise",
        severity="warning",
        source=source,
        evidence=Evidence(text=f"{text} #{seq}", start=start, end=start + 5.0, seq=seq),
        reviewer=reviewer,
    )


GEMMA = Reviewer("gemma3-270m+edge", "ab" * 32)


def kinds(events: list[AlertEvent]) -> list[tuple[str, int]]:
    return [(e.type.value, e.seq) for e in events]


def test_first_match_emits_new_alert(clocks: Clocks) -> None:
    """The first match of a fault emits a `new` event with the full public alert."""
    tracker = make_tracker(clocks)
    [event] = tracker.observe(obs(1))
    assert event.type is EventType.new
    assert event.seq == 1
    assert event.ts == WALL0
    alert = event.alert
    assert alert["stream_id"] == "mic1"
    assert alert["fault"] == "bearing_noise"
    assert alert["severity"] == "warning"
    assert alert["source"] == "keyword"
    assert alert["count"] == 1
    assert alert["sources"] == ["keyword"]
    assert alert["evidence"] == [
        {
            "text": "bearing noise #1",
            "start": WALL0 + 5,
            "end": WALL0 + 10,
            "seq": 1,
            "source": "keyword",
            "confidence": None,
        }
    ]
    assert (alert["first_seen"], alert["last_seen"]) == (WALL0 + 5, WALL0 + 10)
    assert event.payload() == {"type": "new", "seq": 1, "ts": WALL0, "alert": alert}


def test_repeat_within_debounce_is_held_then_flushed_by_tick(clocks: Clocks) -> None:
    """Repeats inside the debounce window emit nothing at once; tick emits one update later."""
    tracker = make_tracker(clocks)
    tracker.observe(obs(1))
    clocks.advance(1)
    assert tracker.observe(obs(2)) == []
    clocks.advance(1)
    assert tracker.observe(obs(3)) == []
    clocks.advance(3)
    assert tracker.tick() == []  # 5 s after the new event: still inside the window
    clocks.advance(5)
    [update] = tracker.tick()  # 10 s after the new event
    assert (update.type, update.seq) == (EventType.update, 2)
    assert update.alert["count"] == 3
    assert [e["seq"] for e in update.alert["evidence"]] == [1, 2, 3]
    assert tracker.tick() == []  # nothing more to flush


def test_at_most_one_update_per_debounce_window(clocks: Clocks) -> None:
    """However many matches arrive, updates go out at most once per debounce window."""
    tracker = make_tracker(clocks)
    events = tracker.observe(obs(1))
    for i in range(2, 32):  # a match every second for 30 s, ticking every second
        clocks.advance(1)
        events += tracker.observe(obs(i))
        events += tracker.tick()
    updates = [e for e in events if e.type is EventType.update]
    assert len(updates) == 3
    assert [u.alert["count"] for u in updates] == [11, 21, 31]


def test_repeat_after_debounce_window_updates_immediately(clocks: Clocks) -> None:
    """A match arriving after the debounce window has passed is published at once."""
    tracker = make_tracker(clocks)
    tracker.observe(obs(1))
    clocks.advance(15)
    [update] = tracker.observe(obs(2))
    assert (update.type, update.seq) == (EventType.update, 2)
    assert update.alert["count"] == 2


def test_zero_debounce_publishes_every_match(clocks: Clocks) -> None:
    """With debounce_s 0 every repeated match is its own update."""
    tracker = make_tracker(clocks, Timing(debounce_s=0))
    events = tracker.observe(obs(1)) + tracker.observe(obs(2)) + tracker.observe(obs(3))
    assert kinds(events) == [("new", 1), ("update", 2), ("update", 3)]


def test_alert_ends_after_quiet_period(clocks: Clocks) -> None:
    """With no match for quiet_end_s the alert ends, and not before."""
    tracker = make_tracker(clocks)
    tracker.observe(obs(1))
    clocks.advance(119)
    assert tracker.tick() == []
    clocks.advance(1)
    [end] = tracker.tick()
    assert end.type is EventType.end
    assert tracker.active() == []


def test_matches_keep_the_alert_alive(clocks: Clocks) -> None:
    """The quiet period counts from the last match, not from the first."""
    tracker = make_tracker(clocks)
    tracker.observe(obs(1))
    clocks.advance(100)
    assert [e.type for e in tracker.observe(obs(2))] == [EventType.update]
    clocks.advance(100)
    assert tracker.tick() == []  # 200 s after the first match, 100 s after the last
    clocks.advance(20)
    assert [e.type for e in tracker.tick()] == [EventType.end]


def test_lifecycle_sequence_numbers_count_1_2_3(clocks: Clocks) -> None:
    """new, update and end of one alert carry seq 1, 2, 3 and the same id."""
    tracker = make_tracker(clocks)
    events = tracker.observe(obs(1))
    clocks.advance(1)
    events += tracker.observe(obs(2))
    clocks.advance(10)
    events += tracker.tick()
    clocks.advance(200)
    events += tracker.tick()
    assert kinds(events) == [("new", 1), ("update", 2), ("end", 3)]
    assert len({e.alert_id for e in events}) == 1
    assert events[-1].alert["count"] == 2


def test_end_event_carries_pending_update_state(clocks: Clocks) -> None:
    """An alert ending with a held update still reports every match in its end event."""
    tracker = make_tracker(clocks, Timing(debounce_s=300, quiet_end_s=60))
    tracker.observe(obs(1))
    clocks.advance(1)
    tracker.observe(obs(2))
    clocks.advance(60)
    [end] = tracker.tick()
    assert (end.type, end.seq) == (EventType.end, 2)
    assert end.alert["count"] == 2


def test_id_is_stable_while_active_and_new_after_end(clocks: Clocks) -> None:
    """Matches of an active alert share its id; after it ended a new id is used."""
    tracker = make_tracker(clocks)
    first = tracker.observe(obs(1))[0]
    clocks.advance(30)
    again = tracker.observe(obs(2))[0]
    assert again.alert_id == first.alert_id
    clocks.advance(200)
    [end] = tracker.tick()
    assert end.alert_id == first.alert_id
    clocks.advance(1)
    [reborn] = tracker.observe(obs(3))
    assert reborn.type is EventType.new
    assert reborn.seq == 1
    assert reborn.alert_id != first.alert_id
    assert reborn.alert["count"] == 1


def test_new_id_after_end_even_if_wall_clock_did_not_move(clocks: Clocks) -> None:
    """An alert raised again in the same millisecond its predecessor ended gets a new id."""
    tracker = make_tracker(clocks)
    first = tracker.observe(obs(1))[0]
    clocks.mono += 200  # the wall clock stands still (coarse, or stepped back by NTP)
    tracker.tick()
    [reborn] = tracker.observe(obs(2))
    assert reborn.type is EventType.new
    # Consumers dedupe by (id, seq): an equal id would make this new alert look like
    # a redelivery of the old alert's `new` event.
    assert reborn.alert_id != first.alert_id


def test_streams_and_faults_are_separate_alerts(clocks: Clocks) -> None:
    """Each (stream, fault) pair has its own alert, id and sequence."""
    tracker = make_tracker(clocks)
    a = tracker.observe(obs(1, stream="mic1"))
    b = tracker.observe(obs(1, stream="mic2"))
    c = tracker.observe(obs(1, stream="mic1", fault="belt_slip"))
    assert [e.type for e in a + b + c] == [EventType.new] * 3
    assert len({e.alert_id for e in a + b + c}) == 3
    assert all(e.seq == 1 for e in a + b + c)
    assert len(tracker.active()) == 3


def test_evidence_is_bounded_to_the_latest_items(clocks: Clocks) -> None:
    """Only the newest max_evidence items are kept; count and times cover all matches."""
    tracker = make_tracker(clocks, Timing(debounce_s=0, max_evidence=2))
    events: list[AlertEvent] = []
    for i in range(1, 5):
        events += tracker.observe(obs(i))
    last = events[-1].alert
    assert [e["seq"] for e in last["evidence"]] == [3, 4]
    assert last["count"] == 4
    assert last["first_seen"] == WALL0 + 5
    assert last["last_seen"] == WALL0 + 25


def test_llm_joins_keyword_alert_as_a_second_source(clocks: Clocks) -> None:
    """The LLM seeing the same fault updates the keyword alert: one id, both sources."""
    tracker = make_tracker(clocks, Timing(debounce_s=0))
    [new] = tracker.observe(obs(1, source="keyword"))
    [update] = tracker.observe(obs(2, source="llm"))
    assert update.alert_id == new.alert_id
    assert update.alert["source"] == "keyword"
    assert update.alert["sources"] == ["keyword", "llm"]
    assert update.alert["count"] == 2
    [later] = tracker.observe(obs(3, source="keyword"))
    assert later.alert["sources"] == ["keyword", "llm"]
    assert len(tracker.active()) == 1


def test_same_segment_from_both_tiers_counts_once(clocks: Clocks) -> None:
    """The LLM quoting the segment the keyword tier matched adds its name, not a count;
    the same tier seeing the same segment again changes nothing."""
    tracker = make_tracker(clocks, Timing(debounce_s=0))
    tracker.observe(obs(1, source="keyword"))
    [confirm] = tracker.observe(obs(1, source="llm", text="quoted"))
    assert confirm.type is EventType.update
    assert confirm.alert["count"] == 1
    assert confirm.alert["sources"] == ["keyword", "llm"]
    assert [(e["seq"], e["source"]) for e in confirm.alert["evidence"]] == [
        (1, "keyword"),
        (1, "llm"),
    ]
    assert tracker.observe(obs(1, source="llm", text="quoted")) == []


def test_confirmation_does_not_postpone_the_end(clocks: Clocks) -> None:
    """Re-confirming an old segment is not a new match: the quiet timer keeps running."""
    tracker = make_tracker(clocks, Timing(debounce_s=0, quiet_end_s=60))
    tracker.observe(obs(1, source="keyword"))
    clocks.mono += 50
    tracker.observe(obs(1, source="llm"))
    clocks.mono += 11
    [end] = tracker.tick()
    assert end.type is EventType.end


def test_per_stream_timing_is_used(clocks: Clocks) -> None:
    """Debounce and quiet period come from the stream's own settings."""
    fast, slow = Timing(quiet_end_s=10), Timing(quiet_end_s=100)
    tracker = AlertTracker(
        lambda s: fast if s == "fast" else slow,
        monotonic=lambda: clocks.mono,
        wall=lambda: clocks.wall,
    )
    tracker.observe(obs(1, stream="fast"))
    tracker.observe(obs(1, stream="slow"))
    clocks.advance(10)
    [end] = tracker.tick()
    assert end.alert["stream_id"] == "fast"
    assert [a.stream_id for a in tracker.active()] == ["slow"]


def test_flush_emits_held_updates_regardless_of_debounce(clocks: Clocks) -> None:
    """flush() (before shutdown) publishes every held update now, and only those."""
    tracker = make_tracker(clocks)
    tracker.observe(obs(1))
    tracker.observe(obs(1, stream="mic2"))
    clocks.advance(1)
    tracker.observe(obs(2))  # held: inside the debounce window
    [update] = tracker.flush()
    assert (update.type, update.seq) == (EventType.update, 2)
    assert update.alert["stream_id"] == "mic1"
    assert update.alert["count"] == 2
    assert tracker.flush() == []
    assert len(tracker.active()) == 2  # flushing does not end anything


def test_restore_keeps_ids_and_continues_sequence(clocks: Clocks) -> None:
    """Alerts restored after a restart keep their id and continue their event seq."""
    before = make_tracker(clocks)
    before.observe(obs(1))
    clocks.advance(1)
    before.observe(obs(2))
    [update] = before.flush()
    saved = [Alert.from_public(a.public(), a.event_seq) for a in before.active()]

    clocks.advance(3600)  # a long outage: restored alerts must not end at once
    after = make_tracker(clocks)
    after.restore(saved)
    assert after.tick() == []
    assert [a.id for a in after.active()] == [update.alert_id]
    clocks.advance(30)
    [next_update] = after.observe(obs(3))
    assert next_update.alert_id == update.alert_id
    assert (next_update.type, next_update.seq) == (EventType.update, update.seq + 1)
    assert next_update.alert["count"] == 3


def test_restored_alert_ends_after_a_fresh_quiet_period(clocks: Clocks) -> None:
    """A restored alert with no new match ends quiet_end_s after the restart."""
    tracker = make_tracker(clocks)
    tracker.observe(obs(1))
    saved = [Alert.from_public(a.public(), a.event_seq) for a in tracker.active()]
    restarted = make_tracker(clocks)
    restarted.restore(saved)
    clocks.advance(119)
    assert restarted.tick() == []
    clocks.advance(1)
    [end] = restarted.tick()
    assert (end.type, end.seq, end.alert_id) == (EventType.end, 2, saved[0].id)


def test_alert_public_round_trips(clocks: Clocks) -> None:
    """Alert.from_public(public()) rebuilds the same alert (what the outbox stores)."""
    tracker = make_tracker(clocks)
    tracker.observe(obs(1))
    [alert] = tracker.active()
    rebuilt = Alert.from_public(alert.public(), alert.event_seq)
    assert rebuilt == alert
    assert rebuilt.public() == alert.public()


def test_confirming_a_segment_that_scrolled_out_of_the_evidence_counts_once(
    clocks: Clocks,
) -> None:
    """The LLM quoting a keyword segment older than the kept evidence neither counts it
    again nor keeps the alert alive."""
    tracker = make_tracker(clocks, Timing(debounce_s=0, max_evidence=2, quiet_end_s=60))
    for seq in range(1, 6):
        tracker.observe(obs(seq))
    [alert] = tracker.active()
    assert [e.seq for e in alert.evidence] == [4, 5]
    clocks.mono += 50
    [confirm] = tracker.observe(obs(1, source="llm"))
    assert confirm.alert["count"] == 5
    clocks.mono += 11
    assert [e.type for e in tracker.tick()] == [EventType.end]


def test_a_keyword_alert_is_unreviewed_until_the_slow_tier_names_it(clocks: Clocks) -> None:
    """The NEW of a keyword alert says `unreviewed`; the slow tier naming the fault makes it
    `confirmed` at once, with its line, its model and the seconds since the NEW, even
    inside the debounce window (a verdict is news)."""
    tracker = make_tracker(clocks, Timing(debounce_s=30))
    [new] = tracker.observe(obs(1))
    assert new.alert["verdict"] == "unreviewed"
    assert new.alert["verdict_evidence"] is None and new.alert["verdict_after_s"] is None
    assert new.alert["raised_at"] == WALL0
    clocks.advance(4.5)
    [update] = tracker.observe(obs(1, source="llm", text="quoted", reviewer=GEMMA))
    assert update.type is EventType.update and update.seq == 2
    alert = update.alert
    assert alert["verdict"] == "confirmed"
    assert alert["verdict_evidence"]["text"] == "quoted #1"
    assert alert["verdict_evidence"]["source"] == "llm"
    assert (alert["verdict_model"], alert["verdict_model_sha256"]) == (GEMMA.model, GEMMA.sha256)
    assert alert["verdict_after_s"] == 4.5
    # a second reading changes nothing: the first verdict stands
    clocks.advance(1)
    assert tracker.observe(obs(1, source="llm", text="quoted", reviewer=GEMMA)) == []
    [alert_now] = tracker.active()
    assert alert_now.review.after_s == 4.5


def test_a_reading_that_names_another_fault_leaves_the_verdict(clocks: Clocks) -> None:
    """Silence about a fault is not a verdict on it: the slow tier naming a different fault
    raises that one and leaves the keyword alert unreviewed."""
    tracker = make_tracker(clocks, Timing(debounce_s=0))
    tracker.observe(obs(1))
    [other] = tracker.observe(obs(2, source="llm", fault="overheat", reviewer=GEMMA))
    assert other.type is EventType.new
    by_fault = {a.fault: a for a in tracker.active()}
    assert by_fault["bearing_noise"].review.state is ReviewState.unreviewed
    assert by_fault["overheat"].review.state is ReviewState.confirmed  # its own reading
    assert by_fault["overheat"].review.after_s == 0.0


def test_the_verdict_survives_a_restart_and_an_old_row_reads_unreviewed(clocks: Clocks) -> None:
    """The verdict is stored with the alert (public() is what the outbox keeps); an alert
    stored by a release without verdicts comes back unreviewed, and a later reading
    confirms it with no time to verdict (its NEW's time was not kept)."""
    tracker = make_tracker(clocks, Timing(debounce_s=0))
    tracker.observe(obs(1))
    tracker.observe(obs(1, source="llm", reviewer=GEMMA))
    [alert] = tracker.active()
    rebuilt = Alert.from_public(alert.public(), alert.event_seq)
    assert rebuilt.review == alert.review and rebuilt.raised_at == alert.raised_at
    old = {k: v for k, v in alert.public().items() if not k.startswith(("verdict", "raised"))}
    restored = Alert.from_public(old, 3)
    assert restored.review.state is ReviewState.unreviewed
    fresh = make_tracker(clocks, Timing(debounce_s=0))
    fresh.restore([restored])
    [update] = fresh.observe(obs(1, source="llm", reviewer=GEMMA))
    assert update.seq == 4
    assert update.alert["verdict"] == "confirmed" and update.alert["verdict_after_s"] is None


def test_only_a_line_of_the_alerts_own_confirms_it(clocks: Clocks) -> None:
    """The slow tier naming the fault on a line older than the alert (an ended alert's, read
    late) does not confirm it; a line said since it was raised does. A stored verdict this
    release does not know reads as unreviewed (a rollback must still start)."""
    tracker = make_tracker(clocks, Timing(debounce_s=0))
    tracker.observe(obs(5))
    tracker.observe(obs(2, source="llm", reviewer=GEMMA))  # before the alert's first line
    [alert] = tracker.active()
    assert alert.review.state is ReviewState.unreviewed
    [update] = tracker.observe(obs(6, source="llm", reviewer=GEMMA))
    assert update.alert["verdict"] == "confirmed" and update.reviewed
    future = {**alert.public(), "verdict": "dismissed"}
    assert Alert.from_public(future, 1).review.state is ReviewState.unreviewed


def test_a_late_verdict_on_a_line_already_quoted_adds_no_second_copy(clocks: Clocks) -> None:
    """An alert stored before verdicts, with the slow tier's quote already in its evidence,
    confirmed after a restart by that same quote: the verdict, not a duplicate item."""
    tracker = make_tracker(clocks, Timing(debounce_s=0))
    tracker.observe(obs(1))
    tracker.observe(obs(1, source="llm"))
    [alert] = tracker.active()
    old = {k: v for k, v in alert.public().items() if not k.startswith(("verdict", "raised"))}
    fresh = make_tracker(clocks, Timing(debounce_s=0))
    fresh.restore([Alert.from_public(old, 2)])
    [update] = fresh.observe(obs(1, source="llm", reviewer=GEMMA))
    assert update.alert["verdict"] == "confirmed"
    assert [(e["seq"], e["source"]) for e in update.alert["evidence"]] == [
        (1, "keyword"),
        (1, "llm"),
    ]
