"""The keyword tier as one stage: a transcript segment in, alert events out.

`process(segment)`, one segment at a time (under `lock`, shared with the tick and the LLM's
faults so per-stream order holds):

1. the stream's timeline merges away what was heard before (pipelines.overlap): a repeat
   is counted and goes no further;
2. the detector matches the new text, with the words before it as context
   (pipelines.detect), off the event loop: a long Chinese segment costs up to ~0.5 s;
3. the tracker folds each match into its alert (pipelines.alerts): new, update or nothing
   yet (a debounced update);
4. the events, and the active alerts the segment touched, go to the `AlertSink` in one
   commit that is durable when `process()` returns, so the caller may acknowledge the
   segment's input then (at least once, docs/mqtt.md);
5. the merged text goes on to the slow tier (`SlowTier`, the LLM analyzer) when there is
   one; its accepted faults come back through `observe_llm()` into the same tracker.

`tick()` (every `TICK_S` from `run()`) flushes debounced updates, ends quiet alerts, takes
shelved ones off their shelf when it runs out and ends the alarms of faults the configuration
switched off; `flush()` emits every pending update before a shutdown. `command()` applies an
operator's ack, shelve or unshelve (pipelines/alarm_list.py) and commits its audit event like
any other, so the command's input may be acknowledged once it returns.

What the stage needs from the service it declares here: where the events go (`AlertSink`:
the outbox), the counters it keeps current (`StageCounters`: the service's statistics),
each stream's settings (`StreamRules`) and a clock (tests pass their own). It imports
nothing of `agent`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from pipelines.alarm_list import AlarmList, StandingChanges
from pipelines.alarms import AlarmCommand, ShelvePolicy
from pipelines.alerts import (
    Alert,
    AlertEvent,
    AlertTiming,
    AlertTracker,
    EventType,
    Evidence,
    Observation,
    Reviewer,
)
from pipelines.detect import KeywordDetector
from pipelines.evidence import AcceptedFault
from pipelines.ingest import Segment
from pipelines.overlap import StreamTimeline

__all__ = [
    "TICK_S",
    "AlertBatch",
    "AlertSink",
    "KeywordStage",
    "SlowTier",
    "StageCounters",
    "StreamCounts",
    "StreamRules",
]

log = structlog.get_logger(__name__)

TICK_S = 0.5  # the tracker's tick: debounce flushes and quiet ends are this late at most
_EVIDENCE_CHARS = 500


@dataclass(frozen=True)
class AlertBatch:
    """One commit: alert events, and the rows of active alerts they change."""

    events: Sequence[AlertEvent]
    upserts: Sequence[Alert]  # active alerts to store as they are now
    deletes: Sequence[tuple[str, str]]  # (stream, fault) of the alerts that ended
    standing_upserts: Sequence[Alert] = ()  # alarms that ended unacknowledged
    standing_deletes: Sequence[str] = ()  # ids of standing alarms acknowledged or dropped


class AlertSink(Protocol):
    """Where the stage's events go (the service's outbox)."""

    async def commit(self, batch: AlertBatch) -> None:
        """Durably, before returning: the segment's input is acknowledged after it."""


class SlowTier(Protocol):
    """The stage's hand-off to the LLM tier (pipelines.analysis.Analyzer fits): cheap,
    synchronous and bounded, so the keyword tier never waits for it."""

    def add(
        self,
        stream_id: str,
        *,
        seq: int,
        start: float,
        end: float,
        text: str,
        faults: Sequence[str] = (),
    ) -> None: ...


class StreamRules(Protocol):
    """One stream's settings as the stage reads them (the service's StreamSettings fits)."""

    @property
    def language(self) -> str | None: ...
    @property
    def alerts(self) -> AlertTiming: ...
    @property
    def disabled_faults(self) -> Collection[str]: ...


class StreamCounts(Protocol):
    segments: int
    duplicates: int
    last_segment_mono: float | None


class StageCounters(Protocol):
    """The counters the stage keeps current (the service's Stats fits)."""

    keyword_matches: int
    llm_faults: int
    detect_errors: int

    @property
    def duplicates(self) -> Counter[str]: ...  # by the merge's reason

    def stream(self, stream_id: str) -> StreamCounts: ...


class KeywordStage:
    def __init__(
        self,
        detector: KeywordDetector,
        rules: Callable[[str], StreamRules],
        sink: AlertSink,
        counters: StageCounters,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        shelving: Callable[[], ShelvePolicy] = lambda: ShelvePolicy(max_shelve_s=8 * 3600),
        max_standing: Callable[[], int] = lambda: 256,
    ) -> None:
        """`rules` is asked per segment, so a new configuration applies from the next one;
        `detector` may be replaced between two segments (hold `lock`); `shelving` and
        `max_standing` (the `alarms:` settings) are asked at each use."""
        self.detector = detector
        self._rules = rules
        self._sink = sink
        self._counters = counters
        self._mono = monotonic
        self.tracker = AlertTracker(lambda sid: rules(sid).alerts, monotonic=monotonic, wall=wall)
        self.alarms = AlarmList(self.tracker, shelving, max_standing, wall=wall)
        self.timelines: dict[str, StreamTimeline] = {}
        self.slow: SlowTier | None = None  # the LLM tier, where the service runs one
        self.lock = asyncio.Lock()  # one segment, tick or LLM answer at a time
        self.busy = 0  # segments in process() now
        self.processed = 0  # segments through process() (a progress mark)

    def restore(self, alerts: Iterable[Alert], standing: Iterable[Alert] = ()) -> None:
        """The alerts that were active, and the alarms that stood unacknowledged, before a
        restart (from the outbox)."""
        self.tracker.restore(alerts)
        self.alarms.restore(standing)

    def keyword_alert_streams(self) -> set[str]:
        """Streams with an active alert the keyword tier raised or confirmed (the slow
        tier analyses them first)."""
        return {a.stream_id for a in self.tracker.active() if "keyword" in a.sources}

    async def process(self, seg: Segment) -> None:
        """One segment through merge, detection and the tracker; its events are committed
        when this returns. A bug on one segment is counted and logged, not raised: it must
        not stop the pipeline."""
        async with self.lock:
            self.busy += 1
            try:
                await self._process(seg)
            except Exception:
                self._counters.detect_errors += 1
                log.exception("detect.failed", stream_id=seg.stream_id, seq=seg.seq)
            finally:
                self.busy -= 1
                self.processed += 1

    async def _process(self, seg: Segment) -> None:
        stream = self._counters.stream(seg.stream_id)
        stream.segments += 1
        stream.last_segment_mono = self._mono()
        timeline = self.timelines.setdefault(seg.stream_id, StreamTimeline())
        merged = timeline.accept(seg)
        if merged.duplicate:
            stream.duplicates += 1
            self._counters.duplicates[merged.reason] += 1
            return
        rules = self._rules(seg.stream_id)
        # Off the loop: a long Chinese segment costs up to ~0.5 s of matching.
        matches = await asyncio.to_thread(
            self.detector.detect,
            merged.text,
            context=merged.context,
            lang=seg.lang or rules.language,
            exclude=frozenset(rules.disabled_faults),
        )
        events: list[AlertEvent] = []
        for match in matches:
            self._counters.keyword_matches += 1
            log.info(
                "keyword.match",
                stream_id=seg.stream_id,
                seq=seg.seq,
                fault=match.code,
                keyword=match.keyword,
                matched=match.matched,
                score=round(match.score, 2),
            )
            events += self.tracker.observe(
                Observation(
                    stream_id=seg.stream_id,
                    fault=match.code,
                    label=match.label,
                    severity=match.severity.value,
                    source="keyword",
                    evidence=Evidence(
                        text=merged.text[:_EVIDENCE_CHARS],
                        start=merged.start,
                        end=seg.end,
                        seq=seg.seq,
                    ),
                )
            )
        # A match that was only counted (its update debounced) is written too: a crash
        # before the update goes out must not lose it (the alert is stored as pending).
        await self._commit(events, touched={(seg.stream_id, m.code) for m in matches})
        if self.slow is not None:
            self.slow.add(
                seg.stream_id,
                seq=seg.seq,
                start=merged.start,
                end=seg.end,
                text=merged.text,
                faults=[m.code for m in matches],
            )

    async def observe_llm(
        self,
        stream_id: str,
        faults: Sequence[AcceptedFault],
        reviewer: Reviewer | None = None,
    ) -> None:
        """The slow tier's accepted faults join the keyword tier's alerts in the same
        tracker (the analyzer's `on_faults`); one that names a keyword alert's fault
        confirms it, signed by `reviewer` (the engine's model)."""
        async with self.lock:
            events: list[AlertEvent] = []
            for fault in faults:
                self._counters.llm_faults += 1
                log.info(
                    "llm.fault",
                    stream_id=stream_id,
                    seq=fault.line.seq,
                    fault=fault.code,
                    evidence=fault.quote[:200],
                    confidence=fault.confidence,
                )
                events += self.tracker.observe(
                    fault.observation(stream_id, max_text=_EVIDENCE_CHARS, reviewer=reviewer)
                )
            await self._commit(events, touched={(stream_id, f.code) for f in faults})

    async def tick(self) -> None:
        """Debounced updates that are due, the ends of quiet alerts, shelves that ran out
        and the alarms of faults switched off since, committed."""
        async with self.lock:
            events = self.tracker.tick()
            off, changes = self.alarms.suppress(
                lambda sid, fault: fault in self._rules(sid).disabled_faults
            )
            await self._commit(events + off, standing=changes)

    async def command(self, cmd: AlarmCommand) -> list[AlertEvent]:
        """An operator's command on an alarm, committed (durable) when this returns.

        Raises:
            AlarmRefused: nothing on the list has that id, or the command does not apply
                to the alarm's state; nothing changed and nothing was committed.
        """
        async with self.lock:
            events, changes = self.alarms.command(cmd)
            await self._commit(events, standing=changes)
            return events

    async def run(self, period_s: float = TICK_S) -> None:
        while True:
            await asyncio.sleep(period_s)
            await self.tick()

    async def flush(self) -> None:
        """Every debounced update now, whatever its debounce (before a shutdown)."""
        async with self.lock:
            await self._commit(self.tracker.flush())

    async def _commit(
        self,
        events: list[AlertEvent],
        touched: Collection[tuple[str, str]] = (),
        standing: StandingChanges | None = None,
    ) -> None:
        """Events to the sink, with the active alerts they (or `touched`, the (stream,
        fault) pairs just observed) changed and the standing alarms, in one batch."""
        active = {a.id: a for a in self.tracker.active()}
        changed = {
            a.id: a for a in active.values() if (a.stream_id, a.fault) in touched and a.dirty
        }
        stand = self.alarms.absorb(events)
        if standing is not None:
            stand.upserts += standing.upserts
            stand.deletes += standing.deletes
        if not events and not changed and not stand:
            return
        upserts = list(changed.values())
        deletes = []
        for event in events:
            if event.type is EventType.end:
                deletes.append((event.alert["stream_id"], event.alert["fault"]))
            elif event.alert_id in active and event.alert_id not in changed:
                upserts.append(active[event.alert_id])
        await self._sink.commit(AlertBatch(events, upserts, deletes, stand.upserts, stand.deletes))
