"""MQTT in: every message the broker link delivers, until its segment has been through the
keyword stage and its input is settled.

The path of a transcript, top to bottom here and on in pipelines/keyword_stage.py:

1. `on_message` (the link's callback, on the event loop, one message at a time; a bug in
   it is contained by the link, which counts it and calls `on_message_error`): a fleet
   document goes to the fleet manager, an operator's alarm command to the alarm inbox
   (agent/alarm_inbox.py), an audio clip to `on_audio`, a transcript is parsed
   within the ingest limits (pipelines.ingest: bounded JSON, size, schema, clock skew,
   allowed streams) and checked against `ingest.max_streams`; a refusal is counted and
   reported on `<prefix>/errors` and its message acknowledged at once (it must not come
   back).
2. `accept` puts the segment on the bounded queue with what settles its input (the MQTT
   `Ack`). Once the queue is full, new segments go to the spool on disk (agent/spool.py),
   each settled when its row is committed, and keep going there, in order, until the spool
   is empty again; only a full spool sheds (the new segment: counted, reported, settled).
3. `run` takes one segment at a time to the keyword stage (`KeywordStage.process`): the
   queue first, then the spool's rows in order. A queued segment's input is settled only
   after the stage returned: its alert events are in the outbox by then, so a crash before
   it loses nothing, the broker sends the message again (at least once). A spooled batch
   leaves the spool only after the stage returned for each of its segments.

Audio joins at step 2: `on_audio` checks the clip's stream like a transcript's and hands it,
with its `Ack`, to the ASR stage (pipelines.asr, off the loop), whose segments come back
through `on_heard` into `accept`; the clip's `Ack` is settled by the stage when it refuses,
sheds or hears nothing, else by the last of its segments once processed. With
`asr.publish_transcript` they are published for other consumers too (best effort).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiomqtt
import structlog

from agent.alarm_inbox import operator_property
from agent.audio_link import audio_properties, build_asr_stage, heard_segment
from agent.config.models import AgentConfig
from agent.errors_report import ErrorReporter
from agent.mqtt import Ack, Topics
from agent.publish import Transcripts
from agent.spool import Spool
from agent.stats import Stats
from pipelines.asr.stage import AsrStage, AudioIn, Heard
from pipelines.ingest import (
    STREAM_ID_PATTERN,
    IngestLimits,
    InputRejected,
    RejectReason,
    Segment,
    check_stream_allowed,
    parse_transcript,
)
from pipelines.keyword_stage import KeywordStage
from pipelines.queues import SheddingQueue

__all__ = ["Intake"]

log = structlog.get_logger(__name__)


class FleetInbox(Protocol):
    """Where fleet documents go (agent.fleet.manager.FleetManager): the intake only routes
    them, so it depends on these two calls, not on the fleet package (which reads the
    intake for its health gate)."""

    def target_of(self, topic: str) -> str | None: ...
    def submit(self, topic: str, payload: bytes) -> None: ...


class CommandInbox(Protocol):
    """Where operators' alarm commands go (agent.alarm_inbox.AlarmInbox)."""

    def target_of(self, topic: str) -> tuple[str, str] | None: ...
    def submit(
        self, topic: str, payload: bytes, operator: str | None, settle: Callable[[], None]
    ) -> None: ...


@dataclass(frozen=True)
class _Queued:
    """A segment on its way to the detector, and what settles its input once its effect
    is durable (the MQTT acknowledgement of the transcript, or of the clip it came from)."""

    segment: Segment
    settle: Callable[[], None] | None = None

    def done(self) -> None:
        if self.settle is not None:
            self.settle()


class Intake:
    def __init__(
        self,
        config: Callable[[], AgentConfig],
        topics: Topics,
        stats: Stats,
        *,
        errors: ErrorReporter,
        stage: KeywordStage,
        transcripts: Transcripts,
        spool: Spool | None = None,
        alarms: CommandInbox | None = None,
    ) -> None:
        """`config`: the configuration now (stream settings follow a fleet apply; the
        ingest limits and the queue are the ones at construction); `alarms`: where
        operators' commands go (None: `alarms.commands` is off)."""
        cfg = config()
        self._config = config
        self._topics = topics
        self._stats = stats
        self._errors = errors
        self._stage = stage
        self._transcripts = transcripts
        self._alarms = alarms
        self.limits = IngestLimits(
            max_payload_bytes=cfg.ingest.max_payload_bytes,
            max_text_chars=cfg.ingest.max_text_chars,
            allowed_streams=frozenset(cfg.ingest.allowed_streams)
            if cfg.ingest.allowed_streams is not None
            else None,
            max_future_skew_s=cfg.ingest.max_future_skew_s,
        )
        self.queue: SheddingQueue[_Queued] = SheddingQueue(cfg.ingest.queue_size)
        self.spool = spool  # None: a full queue sheds its oldest (ingest.spool_max_segments 0)
        self.spool_shed = 0  # segments shed because the spool was full
        self._max_streams = cfg.ingest.max_streams
        self.asr: AsrStage | None = None
        if cfg.asr.enabled:
            self.asr = build_asr_stage(cfg.asr, cfg.faults, self.on_heard, errors.report)
        self.fleet: FleetInbox | None = None  # fleet documents go here (set by the daemon)
        self.taken = 0  # segments taken off the queue by run()
        self.paused_until = 0.0  # fault.pause_detect (tests only)

    @property
    def processed(self) -> int:
        """Segments through the keyword stage (the progress mark of systemd's pings and the
        fleet's health gate)."""
        return self._stage.processed

    def waiting(self) -> int:
        """Segments accepted and not yet through the stage (the spool's included)."""
        spooled = self.spool.depth if self.spool is not None else 0
        return len(self.queue) + spooled + self.taken - self._stage.processed

    # -- in -------------------------------------------------------------------------------

    def on_message(self, message: aiomqtt.Message, ack: Ack) -> None:
        """One message from the broker. `ack` is settled once its effect is durable or it
        is refused: a transcript after the detector took it and its events are in the
        outbox, a clip after its segments went the same way (docs/mqtt.md)."""
        topic = message.topic.value
        payload = message.payload
        raw = payload if isinstance(payload, bytes | bytearray) else str(payload).encode()
        if self.fleet is not None and self.fleet.target_of(topic) is not None:
            # Retained, and sent again at every subscription: a document a crash interrupted
            # comes back at the next start (the manager also persists its progress).
            self.fleet.submit(topic, bytes(raw))
            ack()
            return
        if self._alarms is not None and self._alarms.target_of(topic) is not None:
            # Settled by the inbox once applied and durable, or refused (agent/alarm_inbox.py).
            operator = operator_property(message.properties)
            self._alarms.submit(topic, bytes(raw), operator, ack)
            return
        if self.asr is not None and (audio_stream := self._topics.audio_stream(topic)):
            self.on_audio(audio_stream, topic, bytes(raw), message.properties, ack)
            return
        stream_id = self._topics.transcript_stream(topic)
        self._stats.received += 1
        if stream_id is None:
            ack()
            self._reject(
                topic, len(raw), InputRejected(RejectReason.invalid_schema, "unknown topic")
            )
            return
        try:
            segment = parse_transcript(stream_id, bytes(raw), self.limits, time.time())
            self._check_new_stream(stream_id)
        except InputRejected as exc:
            ack()
            self._reject(topic, len(raw), exc)
            return
        self.accept(segment, topic, len(raw), settle=ack)

    def on_message_error(self, message: aiomqtt.Message, exc: Exception) -> None:
        """A bug while handling one message (the link counted and logged it with the
        traceback): the sender hears of it on the errors topic like any refusal."""
        payload = message.payload
        size = len(payload) if isinstance(payload, bytes | bytearray | str) else 0
        self._errors.report(
            message.topic.value, RejectReason.internal_error.value, size, repr(exc)[:200]
        )

    def _check_new_stream(self, stream_id: str) -> None:
        if stream_id not in self._stats.streams and len(self._stats.streams) >= self._max_streams:
            raise InputRejected(
                RejectReason.too_many_streams,
                f"already {self._max_streams} streams (ingest.max_streams)",
            )

    def _reject(self, topic: str, size: int, exc: InputRejected) -> None:
        self._stats.rejected[exc.reason.value] += 1
        self._errors.report(topic, exc.reason.value, size, exc.detail)

    def accept(
        self,
        segment: Segment,
        topic: str,
        size: int,
        arrived_mono: float | None = None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        """Into the detector's queue: published transcripts and our own alike."""
        stream_id = segment.stream_id
        self._stats.stream(stream_id)  # counted from acceptance on, so the bound holds
        self._stats.accepted += 1
        self._stats.arrived(stream_id, segment.seq, at=arrived_mono)
        spool = self.spool
        if spool is not None and (spool.depth or self.queue.full()):
            if not spool.full():
                spool.put(segment, settle)  # settled once on disk
                return
            if settle is not None:
                settle()  # shed on purpose (counted, reported): not to be sent again
            self.spool_shed += 1
            self._stats.ingest_shed += 1
            self._errors.report(
                topic,
                "spool_full",
                size,
                f"ingest spool full ({spool.max_segments}); shed {stream_id} seq {segment.seq}",
            )
            return
        shed = self.queue.put(_Queued(segment, settle))
        if shed is not None:
            shed.done()  # dropped on purpose (counted, reported): not to be sent again
            self._stats.ingest_shed += 1
            gone = shed.segment
            self._errors.report(
                topic,
                "queue_full",
                size,
                f"ingest queue full ({self.queue.maxsize}); shed {gone.stream_id} seq {gone.seq}",
            )

    # -- audio ----------------------------------------------------------------------------

    def on_audio(
        self, stream_id: str, topic: str, payload: bytes, properties: Any, ack: Ack
    ) -> None:
        """An audio clip: checked like a transcript's stream, then handed to the ASR stage,
        which decodes and transcribes it off the event loop. Its `ack` goes with it: the
        stage settles it when it refuses or sheds the clip or hears nothing in it, else
        the last of its segments does, once processed."""
        assert self.asr is not None
        try:
            if not re.match(STREAM_ID_PATTERN, stream_id):
                raise InputRejected(RejectReason.invalid_schema, f"stream id {stream_id!r}")
            check_stream_allowed(stream_id, self.limits)
            self._check_new_stream(stream_id)
            seq, start = audio_properties(properties)
        except InputRejected as exc:
            ack()
            self.asr.rejected[exc.reason.value] += 1
            self._errors.report(topic, exc.reason.value, len(payload), exc.detail)
            return
        self._stats.stream(stream_id)  # its slot counts against ingest.max_streams from now
        language = self._config().streams.for_stream(stream_id).language
        self.asr.submit(
            AudioIn(stream_id, payload, topic, seq=seq, start=start, language=language, done=ack)
        )

    def on_heard(self, heard: list[Heard]) -> None:
        """The ASR stage's segments take the transcript path; optionally published too."""
        for h in heard:
            segment = heard_segment(h, self.limits.max_text_chars)
            topic = self._topics.asr_transcript(h.stream_id)
            body = segment.model_dump_json().encode()
            self.accept(segment, topic, len(body), arrived_mono=h.arrived_mono, settle=h.done)
            if self._config().asr.publish_transcript:
                self._transcripts.put(topic, body)

    # -- to the keyword stage -------------------------------------------------------------

    async def run(self) -> None:
        """The queue, then the spool, into the keyword stage, one segment at a time."""
        while True:
            item = self.queue.get_nowait()
            if item is None and self.spool is not None and self.spool.stored:
                await self._from_spool(self.spool)
                continue
            if item is None:
                await self._next()
                continue
            while (left := self.paused_until - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 0.1))  # fault.pause_detect (tests only)
            self.taken += 1
            await self._stage.process(item.segment)
            item.done()  # its alert events are committed (or it raised none)

    async def _next(self) -> None:
        """Until the queue or the spool has something."""
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self.queue.wait())]
        if self.spool is not None:
            waits.append(asyncio.ensure_future(self.spool.ready.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _from_spool(self, spool: Spool, batch: int = 64) -> None:
        rows = await spool.peek(batch)
        for row in rows:
            self.taken += 1
            await self._stage.process(row.segment)
        if rows:
            await spool.done_through(rows[-1].id)

    def pause(self, seconds: float) -> None:
        """Queued input stays unprocessed (and unacknowledged) this long (tests only)."""
        self.paused_until = time.monotonic() + seconds

    async def drain(self, limit_s: float) -> None:
        """Audio being transcribed first (its segments join the queue), then the queue."""
        deadline = time.monotonic() + limit_s

        def busy() -> bool:
            asr_busy = self.asr is not None and self.asr.state == "ready" and not self.asr.idle
            return bool(asr_busy or len(self.queue) or self._stage.busy)

        while busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.asr is not None and not self.asr.idle:
            log.warning("asr.not_drained", **self.asr.snapshot()["queue"])

    async def process_queued(self) -> None:
        """What is still queued, through the stage now (after the link stopped)."""
        while (item := self.queue.get_nowait()) is not None:
            await self._stage.process(item.segment)
            item.done()
