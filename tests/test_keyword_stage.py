"""The keyword stage alone (pipelines/keyword_stage.py): segments in, alert events out.

Real detector, timeline and tracker over a small catalogue; the sink, the counters and the
slow tier are plain recorders of what the stage hands them; the clocks move only when told.
Nothing of `agent` is imported: the stage stands on its own.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import pytest

from pipelines.alerts import AlertEvent, AlertTiming, EventType
from pipelines.compat import timeout
from pipelines.context import ContextLine
from pipelines.detect import FaultRule, KeywordDetector, KeywordSettings, Severity
from pipelines.evidence import AcceptedFault
from pipelines.ingest import Segment
from pipelines.keyword_stage import AlertBatch, KeywordStage, StreamRules

WALL0 = 1_700_000_000.0

CATALOGUE = [
    FaultRule(
        code="bearing_noise",
        severity=Severity.warning,
        labels={"en": "bearing noise"},
        keywords={"en": ["bearing noise"]},
    ),
    FaultRule(
        code="motor_overload",
        severity=Severity.critical,
        labels={"en": "motor overload"},
        keywords={"en": ["motor overload"]},
    ),
]


@dataclass(frozen=True)
class Timing:
    debounce_s: float = 10.0
    quiet_end_s: float = 120.0
    max_evidence: int = 5


@dataclass(frozen=True)
class Rules:
    language: str | None = "en"
    alerts: AlertTiming = field(default_factory=Timing)
    disabled_faults: Collection[str] = ()


class Clocks:
    def __init__(self) -> None:
        self.mono = 500.0
        self.wall = WALL0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


class Sink:
    """Every batch the stage commits, in order."""

    def __init__(self) -> None:
        self.batches: list[AlertBatch] = []

    async def commit(self, batch: AlertBatch) -> None:
        self.batches.append(batch)

    @property
    def events(self) -> list[AlertEvent]:
        return [e for b in self.batches for e in b.events]


@dataclass
class StreamCounts:
    segments: int = 0
    duplicates: int = 0
    last_segment_mono: float | None = None


@dataclass
class Counters:
    keyword_matches: int = 0
    llm_faults: int = 0
    detect_errors: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)
    streams: dict[str, StreamCounts] = field(default_factory=dict)

    def stream(self, stream_id: str) -> StreamCounts:
        return self.streams.setdefault(stream_id, StreamCounts())


@dataclass(frozen=True)
class Added:
    stream_id: str
    seq: int
    text: str
    faults: tuple[str, ...]


class SlowTier:
    def __init__(self) -> None:
        self.added: list[Added] = []

    def add(
        self,
        stream_id: str,
        *,
        seq: int,
        start: float,
        end: float,
        text: str,
        faults: Sequence[str] = (),
    ) -> None:
        self.added.append(Added(stream_id, seq, text, tuple(faults)))


@dataclass
class Stage:
    stage: KeywordStage
    sink: Sink
    counters: Counters
    clocks: Clocks


def make_stage(rules: dict[str, StreamRules] | None = None) -> Stage:
    clocks, sink, counters = Clocks(), Sink(), Counters()
    per_stream = rules or {}
    stage = KeywordStage(
        KeywordDetector(CATALOGUE, KeywordSettings()),
        lambda sid: per_stream.get(sid, Rules()),
        sink,
        counters,
        monotonic=lambda: clocks.mono,
        wall=lambda: clocks.wall,
    )
    return Stage(stage, sink, counters, clocks)


@pytest.fixture
def s() -> Stage:
    return make_stage()


def seg(seq: int, text: str, *, stream: str = "mic1", start: float | None = None) -> Segment:
    begin = WALL0 + 2.0 * seq if start is None else start
    return Segment(stream_id=stream, seq=seq, start=begin, end=begin + 2.0, text=text)


def kinds(events: Sequence[AlertEvent]) -> list[tuple[str, str, int]]:
    return [(e.type.value, e.alert["fault"], e.seq) for e in events]


async def test_a_keyword_raises_a_new_alert_committed_with_its_row(s: Stage) -> None:
    await s.stage.process(seg(1, "the operator hears bearing noise on line three"))
    [batch] = s.sink.batches
    [event] = batch.events
    assert event.type is EventType.new and event.seq == 1
    alert = event.alert
    assert (alert["stream_id"], alert["fault"], alert["severity"]) == (
        "mic1",
        "bearing_noise",
        "warning",
    )
    assert alert["source"] == "keyword" and alert["count"] == 1
    assert alert["evidence"][0]["seq"] == 1
    assert "bearing noise" in alert["evidence"][0]["text"]
    assert [a.id for a in batch.upserts] == [event.alert_id] and batch.deletes == []
    assert s.counters.keyword_matches == 1
    stream = s.counters.streams["mic1"]
    assert stream.segments == 1 and stream.last_segment_mono == s.clocks.mono
    assert s.stage.processed == 1 and s.stage.busy == 0


async def test_text_without_a_keyword_commits_nothing(s: Stage) -> None:
    await s.stage.process(seg(1, "all quiet on line three, nothing to report"))
    assert s.sink.batches == [] and s.counters.keyword_matches == 0
    assert s.counters.streams["mic1"].segments == 1


async def test_a_debounced_repeat_is_stored_then_its_update_flushed_by_the_tick(s: Stage) -> None:
    await s.stage.process(seg(1, "bearing noise again"))
    s.clocks.advance(1.0)
    await s.stage.process(seg(2, "still that bearing noise"))
    # Counted, not yet published: the alert's row is written (pending) without an event.
    repeat = s.sink.batches[-1]
    assert repeat.events == [] and [a.count for a in repeat.upserts] == [2]
    await s.stage.tick()  # within the debounce: nothing due
    assert len(s.sink.batches) == 2
    s.clocks.advance(Timing.debounce_s)
    await s.stage.tick()
    assert kinds(s.sink.batches[-1].events) == [("update", "bearing_noise", 2)]
    assert s.sink.batches[-1].events[0].alert["count"] == 2


async def test_flush_emits_a_pending_update_whatever_its_debounce(s: Stage) -> None:
    await s.stage.process(seg(1, "bearing noise"))
    await s.stage.process(seg(2, "bearing noise"))
    await s.stage.flush()
    assert kinds(s.sink.events) == [("new", "bearing_noise", 1), ("update", "bearing_noise", 2)]


async def test_a_quiet_alert_ends_and_its_row_is_deleted(s: Stage) -> None:
    await s.stage.process(seg(1, "motor overload alarm"))
    s.clocks.advance(Timing.quiet_end_s)
    await s.stage.tick()
    end = s.sink.batches[-1]
    assert kinds(end.events) == [("end", "motor_overload", 2)]
    assert end.deletes == [("mic1", "motor_overload")] and end.upserts == []
    assert s.stage.tracker.active() == []


async def test_a_redelivered_segment_is_a_duplicate_and_raises_nothing(s: Stage) -> None:
    first = seg(1, "bearing noise on line three")
    await s.stage.process(first)
    await s.stage.process(first)  # QoS 1 redelivery: the same seq again
    await s.stage.process(seg(2, "bearing noise", start=first.start))  # a covered range
    assert kinds(s.sink.events) == [("new", "bearing_noise", 1)]
    assert s.counters.duplicates == Counter({"seq_repeat": 1, "covered": 1})
    assert s.counters.streams["mic1"].duplicates == 2 and s.counters.keyword_matches == 1


async def test_a_phrase_cut_by_a_segment_boundary_still_matches(s: Stage) -> None:
    await s.stage.process(seg(1, "I can hear the motor"))
    assert s.sink.events == []
    await s.stage.process(seg(2, "overload alarm going off"))
    [event] = s.sink.events
    assert event.alert["fault"] == "motor_overload" and event.alert["evidence"][0]["seq"] == 2


async def test_streams_are_separate_and_a_disabled_fault_is_never_raised() -> None:
    s = make_stage({"mic2": Rules(disabled_faults=("bearing_noise",))})
    await s.stage.process(seg(1, "bearing noise", stream="mic1"))
    await s.stage.process(seg(1, "bearing noise and a motor overload", stream="mic2"))
    raised = {(e.alert["stream_id"], e.alert["fault"]) for e in s.sink.events}
    assert raised == {("mic1", "bearing_noise"), ("mic2", "motor_overload")}


async def test_merged_text_goes_on_to_the_slow_tier_and_its_faults_come_back(s: Stage) -> None:
    slow = SlowTier()
    s.stage.slow = slow
    await s.stage.process(seg(1, "bearing noise on line three"))
    await s.stage.process(seg(2, "the gearbox casing is hot"))
    assert [(a.seq, a.faults) for a in slow.added] == [(1, ("bearing_noise",)), (2, ())]
    assert s.stage.keyword_alert_streams() == {"mic1"}
    line = ContextLine(seq=2, start=WALL0 + 4, end=WALL0 + 6, text=slow.added[1].text, ids=())
    hot = AcceptedFault("gearbox_hot", "gearbox hot", "warning", line, "casing is hot", None)
    confirm = AcceptedFault("bearing_noise", "bearing noise", "warning", line, "noise", None)
    s.clocks.advance(Timing.debounce_s)
    await s.stage.observe_llm("mic1", [hot, confirm])
    assert s.counters.llm_faults == 2
    events = s.sink.batches[-1].events
    assert kinds(events) == [("new", "gearbox_hot", 1), ("update", "bearing_noise", 2)]
    assert events[0].alert["source"] == "llm"
    assert events[1].alert["sources"] == ["keyword", "llm"]


async def test_a_failing_sink_is_counted_and_the_next_segment_goes_through(s: Stage) -> None:
    class Failing(Sink):
        async def commit(self, batch: AlertBatch) -> None:
            if not self.batches and batch.events:
                self.batches.append(AlertBatch([], [], []))  # remember the first call
                raise RuntimeError("injected bug")
            await super().commit(batch)

    sink = Failing()
    stage = KeywordStage(
        KeywordDetector(CATALOGUE, KeywordSettings()),
        lambda _sid: Rules(),
        sink,
        s.counters,
        monotonic=lambda: s.clocks.mono,
        wall=lambda: s.clocks.wall,
    )
    await stage.process(seg(1, "bearing noise"))  # does not raise
    assert s.counters.detect_errors == 1 and stage.processed == 1 and stage.busy == 0
    await stage.process(seg(2, "motor overload", stream="mic2"))
    assert kinds(sink.events) == [("new", "motor_overload", 1)]


async def test_run_ticks_on_its_period(s: Stage) -> None:
    """`run()` is the tick on a period (TICK_S in the service); here as short as it goes."""
    await s.stage.process(seg(1, "motor overload"))
    s.clocks.advance(Timing.quiet_end_s)
    ticking = asyncio.create_task(s.stage.run(period_s=0))
    try:
        async with timeout(10):
            while s.stage.tracker.active():
                await asyncio.sleep(0)
    finally:
        ticking.cancel()
    assert kinds(s.sink.batches[-1].events) == [("end", "motor_overload", 2)]
