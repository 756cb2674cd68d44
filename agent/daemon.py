"""The daemon: MQTT in -> ingest -> overlap merge -> keyword tier -> tracker -> outbox -> MQTT out,
and, with `llm.enabled`, merged text -> per-stream rolling context -> LLM analysis -> tracker.

Tasks (one TaskGroup, each named): the broker link, the detector loop over the bounded
ingest queue, the tracker tick (debounce flushes, quiet ends), the outbox publisher, the
error reporter, the status publisher and the memory watchdog; with the LLM, the engine
supervisor (start, restarts, the tuning ladder: agent.supervisor) and the analysis workers
(pipelines.analysis), which never hold up the keyword tier. Stopping drains in the
order that loses nothing: finish the queued segments, flush pending updates into the
outbox, give the outbox a grace period to empty (what remains stays on disk for the next
start), announce `stopped`, disconnect, then persist anything that arrived meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiomqtt
import structlog

from agent import __version__
from agent.audio_link import audio_properties, build_asr_stage, heard_segment
from agent.config.loader import LoadedConfig, default_socket_path, resolve_mqtt_password
from agent.config.models import AgentConfig
from agent.control import ControlServer
from agent.errors_report import ErrorReporter
from agent.fleet.manager import FleetManager, Health, effective_config, fleet_filters
from agent.fleet.planning import plan_verdict
from agent.fleet.store import FleetStore
from agent.metrics import Histogram, MetricsServer, SnapshotCollector
from pipelines.compat import TaskGroup

if TYPE_CHECKING:
    from agent.analysis_link import EngineCodec
from agent.mqtt import Ack, MqttLink, NotConnectedError, Topics
from agent.notify import SystemdNotifier
from agent.outbox import Outbox, PendingEvent
from agent.stats import Stats
from agent.status import Status
from agent.supervisor import EngineSupervisor
from agent.watchdog.events import EventLog
from agent.watchdog.monitor import MemoryWatchdog
from agent.watchdog.probes import HostProbe, MemoryProbe, NvmlGpu
from agent.watchdog.store import RungStore
from pipelines.alerts import AlertEvent, AlertTracker, EventType, Evidence, Observation
from pipelines.analysis import Analyzer
from pipelines.asr.stage import AsrStage, AudioIn, Heard
from pipelines.detect import KeywordDetector
from pipelines.evidence import AcceptedFault
from pipelines.ingest import (
    STREAM_ID_PATTERN,
    IngestLimits,
    InputRejected,
    RejectReason,
    Segment,
    check_stream_allowed,
    parse_transcript,
)
from pipelines.overlap import StreamTimeline
from pipelines.queues import SheddingQueue

__all__ = ["Daemon"]

log = structlog.get_logger(__name__)

_EVIDENCE_CHARS = 500
_TICK_S = 0.5
_RETRY_S = 1.0
_READY_POLL_S = 0.1
_ACK_WAIT_S = 60.0  # an acknowledgement waits this long for the broker, then stays in status


@dataclass(frozen=True)
class _Queued:
    """A segment on its way to the detector, and what settles its input once its effect
    is durable (the MQTT acknowledgement of the transcript, or of the clip it came from)."""

    segment: Segment
    settle: Callable[[], None] | None = None

    def done(self) -> None:
        if self.settle is not None:
            self.settle()


class Daemon:
    def __init__(self, loaded: LoadedConfig, *, probe: MemoryProbe | None = None) -> None:
        """`probe` replaces the real memory probe (tests feed measured sequences)."""
        local, store = loaded, _fleet_store(loaded.config)
        if store is not None:  # the last known good fleet layers over the local file
            loaded = effective_config(local, store)
        self.loaded = loaded
        cfg = loaded.config
        self.cfg = cfg
        self.topics = Topics(cfg.mqtt.topic_prefix)
        self.stats = Stats()
        for rule in cfg.faults:  # every fault exported from the start, at 0 (docs/metrics.md)
            self.stats.alerts_by_fault[rule.code] = 0
        self.limits = IngestLimits(
            max_payload_bytes=cfg.ingest.max_payload_bytes,
            max_text_chars=cfg.ingest.max_text_chars,
            allowed_streams=frozenset(cfg.ingest.allowed_streams)
            if cfg.ingest.allowed_streams is not None
            else None,
            max_future_skew_s=cfg.ingest.max_future_skew_s,
        )
        self.queue: SheddingQueue[_Queued] = SheddingQueue(cfg.ingest.queue_size)
        self._max_streams = cfg.ingest.max_streams
        self.detector = KeywordDetector(cfg.faults, cfg.keywords)
        self.tracker = AlertTracker(lambda sid: self.cfg.streams.for_stream(sid).alerts)
        self.timelines: dict[str, StreamTimeline] = {}
        self.outbox = Outbox(cfg.outbox.path, cfg.outbox.max_events)
        self.link = MqttLink(
            cfg.mqtt,
            resolve_mqtt_password(cfg.mqtt),
            self.topics,
            self._on_message,
            self.stats,
            audio=cfg.asr.enabled,
            extra_filters=fleet_filters(cfg.fleet, cfg.device_id) if store is not None else (),
            on_error=self._on_message_error,
            receive_maximum=cfg.ingest.queue_size,  # the broker never overfills the queue
        )
        self.errors = ErrorReporter(
            self.link, self.topics.errors, cfg.mqtt.errors_per_minute, self.stats
        )
        self.asr: AsrStage | None = None
        if cfg.asr.enabled:
            self.asr = build_asr_stage(cfg.asr, cfg.faults, self._on_heard, self.errors.report)
        # Our transcripts for other consumers (asr.publish_transcript): best effort, bounded.
        self._asr_out: SheddingQueue[tuple[str, bytes]] = SheddingQueue(256)
        self.asr_published = self.asr_publish_dropped = 0
        self._status_kick = asyncio.Event()
        self.events = EventLog(on_event=self._status_kick.set)
        self.llm: EngineSupervisor | None = None
        self.analysis: Analyzer | None = None
        self._codec: EngineCodec | None = None
        self._build_llm()
        self.watchdog: MemoryWatchdog | None = None
        if cfg.watchdog.enabled:
            gpu = NvmlGpu() if cfg.watchdog.gpu_warn_bytes is not None else None
            self.watchdog = MemoryWatchdog(
                cfg.watchdog,
                probe or HostProbe(gpu=gpu),
                events=self.events,
                supervisor=self.llm,
            )
        self.control, self.metrics = self._local_servers()
        self.fleet: FleetManager | None = None
        if store is not None:
            self.fleet = FleetManager(
                self, local, store, self._publish_ack, plan_check=plan_verdict
            )
        # The fleet gate's marks: segments processed at its last look, detector errors at
        # its start.
        self._health_mark = self._health_errors = 0
        self._stopping = False  # no slow tier is (re)started once shutdown began
        self._new_alerts: deque[float] = deque()  # times of `new` events in the last hour
        self._alerts_today: tuple[str, int] = (time.strftime("%Y-%m-%d"), 0)
        self.notifier = SystemdNotifier()
        # Segments through the detector (the watchdog's progress mark), and taken off the
        # queue by it.
        self._processed = self._taken = 0
        self._tg: TaskGroup | None = None
        self._sup_task: asyncio.Task[None] | None = None
        self._analysis_task: asyncio.Task[None] | None = None
        self._processing = asyncio.Lock()  # one segment at a time through merge and tracker
        self._busy = 0
        self._detect_paused_until = 0.0  # fault.pause_detect

    # -- input --------------------------------------------------------------------------

    def _on_message(self, message: aiomqtt.Message, ack: Ack) -> None:
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
        if self.asr is not None and (audio_stream := self.topics.audio_stream(topic)):
            self._on_audio(audio_stream, topic, bytes(raw), message.properties, ack)
            return
        stream_id = self.topics.transcript_stream(topic)
        self.stats.received += 1
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
        self._accept(segment, topic, len(raw), settle=ack)

    def _on_message_error(self, message: aiomqtt.Message, exc: Exception) -> None:
        """A bug while handling one message (the link counted and logged it with the
        traceback): the sender hears of it on the errors topic like any refusal."""
        payload = message.payload
        size = len(payload) if isinstance(payload, bytes | bytearray | str) else 0
        self.errors.report(
            message.topic.value, RejectReason.internal_error.value, size, repr(exc)[:200]
        )

    def _check_new_stream(self, stream_id: str) -> None:
        if stream_id not in self.stats.streams and len(self.stats.streams) >= self._max_streams:
            raise InputRejected(
                RejectReason.too_many_streams,
                f"already {self._max_streams} streams (ingest.max_streams)",
            )

    def _accept(
        self,
        segment: Segment,
        topic: str,
        size: int,
        arrived_mono: float | None = None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        """Into the detector's queue: published transcripts and our own alike."""
        stream_id = segment.stream_id
        self.stats.stream(stream_id)  # counted from acceptance on, so the bound holds
        self.stats.accepted += 1
        self.stats.arrived(stream_id, segment.seq, at=arrived_mono)
        shed = self.queue.put(_Queued(segment, settle))
        if shed is not None:
            shed.done()  # dropped on purpose (counted, reported): not to be sent again
            self.stats.ingest_shed += 1
            gone = shed.segment
            self.errors.report(
                topic,
                "queue_full",
                size,
                f"ingest queue full ({self.queue.maxsize}); shed {gone.stream_id} seq {gone.seq}",
            )

    def _on_audio(
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
            self.errors.report(topic, exc.reason.value, len(payload), exc.detail)
            return
        self.stats.stream(stream_id)  # its slot counts against ingest.max_streams from now
        language = self.cfg.streams.for_stream(stream_id).language
        self.asr.submit(
            AudioIn(stream_id, payload, topic, seq=seq, start=start, language=language, done=ack)
        )

    def _on_heard(self, heard: list[Heard]) -> None:
        """The ASR stage's segments take the transcript path; optionally published too."""
        for h in heard:
            segment = heard_segment(h, self.limits.max_text_chars)
            topic = self.topics.asr_transcript(h.stream_id)
            body = segment.model_dump_json().encode()
            self._accept(segment, topic, len(body), arrived_mono=h.arrived_mono, settle=h.done)
            if self.cfg.asr.publish_transcript and self._asr_out.put((topic, body)) is not None:
                self.asr_publish_dropped += 1

    async def _asr_publish_loop(self) -> None:
        while True:
            topic, body = await self._asr_out.get()
            try:
                await self.link.publish(topic, body, qos=1)
                self.asr_published += 1
            except NotConnectedError:  # best effort: the alert path does not depend on it
                self.asr_publish_dropped += 1

    def _reject(self, topic: str, size: int, exc: InputRejected) -> None:
        self.stats.rejected[exc.reason.value] += 1
        self.errors.report(topic, exc.reason.value, size, exc.detail)

    # -- processing ---------------------------------------------------------------------

    async def _detect_loop(self) -> None:
        while True:
            item = await self.queue.get()
            while (left := self._detect_paused_until - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 0.1))  # fault.pause_detect (tests only)
            self._taken += 1
            await self.process(item.segment)
            item.done()  # its alert events are committed (or it raised none)

    async def process(self, seg: Segment) -> None:
        async with self._processing:
            self._busy += 1
            try:
                await self._process(seg)
            except Exception:  # a bug on one segment must not stop the pipeline
                self.stats.detect_errors += 1
                log.exception("detect.failed", stream_id=seg.stream_id, seq=seg.seq)
            finally:
                self._busy -= 1
                self._processed += 1

    async def _process(self, seg: Segment) -> None:
        stream = self.stats.stream(seg.stream_id)
        stream.segments += 1
        stream.last_segment_mono = time.monotonic()
        timeline = self.timelines.setdefault(seg.stream_id, StreamTimeline())
        merged = timeline.accept(seg)
        if merged.duplicate:
            stream.duplicates += 1
            self.stats.duplicates[merged.reason] += 1
            return
        settings = self.cfg.streams.for_stream(seg.stream_id)
        # Off the loop: a long Chinese segment costs up to ~0.5 s of matching.
        matches = await asyncio.to_thread(
            self.detector.detect,
            merged.text,
            context=merged.context,
            lang=seg.lang or settings.language,
            exclude=frozenset(settings.disabled_faults),
        )
        events: list[AlertEvent] = []
        for match in matches:
            self.stats.keyword_matches += 1
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
        await self._persist(events, touched={(seg.stream_id, m.code) for m in matches})
        if self.analysis is not None:
            self.analysis.add(
                seg.stream_id,
                seq=seg.seq,
                start=merged.start,
                end=seg.end,
                text=merged.text,
                faults=[m.code for m in matches],
            )

    def _on_window(self, tokens: int) -> None:
        """The watchdog's context rung (or its climb back) resizes every stream's window."""
        if self.analysis is not None:
            self.analysis.set_budget(tokens)

    def _keyword_alert_streams(self) -> set[str]:
        return {a.stream_id for a in self.tracker.active() if "keyword" in a.sources}

    async def _on_llm_faults(self, stream_id: str, faults: Sequence[AcceptedFault]) -> None:
        """Accepted LLM faults join the keyword tier's alerts in the same tracker."""
        async with self._processing:
            events: list[AlertEvent] = []
            for fault in faults:
                self.stats.llm_faults += 1
                log.info(
                    "llm.fault",
                    stream_id=stream_id,
                    seq=fault.line.seq,
                    fault=fault.code,
                    quote=fault.quote,
                    trend=fault.trend,
                )
                events += self.tracker.observe(
                    fault.observation(stream_id, max_text=_EVIDENCE_CHARS)
                )
            await self._persist(events, touched={(stream_id, f.code) for f in faults})

    async def _persist(
        self, events: list[AlertEvent], touched: Collection[tuple[str, str]] = ()
    ) -> None:
        """Events into the outbox, with the active alerts they (or `touched`, the
        (stream, fault) pairs just observed) changed, in one transaction."""
        active = {a.id: a for a in self.tracker.active()}
        changed = {
            a.id: a for a in active.values() if (a.stream_id, a.fault) in touched and a.dirty
        }
        if not events and not changed:
            return
        pending = []
        upserts = list(changed.values())
        deletes = []
        for event in events:
            body = {**event.payload(), "device_id": self.cfg.device_id}
            pending.append(
                PendingEvent(
                    self.topics.alerts,
                    json.dumps(body, ensure_ascii=False).encode(),
                    event.type.value,
                )
            )
            self.stats.alert_events[event.type.value] += 1
            if event.type is EventType.new:
                self._new_alerts.append(time.monotonic())
                today = time.strftime("%Y-%m-%d")
                day, count = self._alerts_today
                self._alerts_today = (today, count + 1 if day == today else 1)
            if self.control is not None:
                self.control.publish(body)
            if event.type is EventType.end:
                deletes.append((event.alert["stream_id"], event.alert["fault"]))
            elif event.alert_id in active and event.alert_id not in changed:
                upserts.append(active[event.alert_id])
            log.info(
                "alert.event",
                type=event.type.value,
                alert_id=event.alert_id,
                stream_id=event.alert["stream_id"],
                fault=event.alert["fault"],
                count=event.alert["count"],
                seq=event.seq,
            )
        await self.outbox.append(pending, upserts, deletes)
        for event in events:  # timed once durable: from here the publisher delivers them
            if event.type is EventType.new:
                alert = event.alert
                seq = alert["evidence"][-1]["seq"] if alert["evidence"] else None
                self.stats.alert_raised(alert["stream_id"], seq, alert["fault"], alert["source"])

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            async with self._processing:
                await self._persist(self.tracker.tick())

    # -- output -------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        while True:
            self.outbox.changed.clear()
            rows = await self.outbox.peek()
            if not rows:
                await self.outbox.changed.wait()
                continue
            await self.link.connected.wait()
            for row in rows:
                try:
                    await self.link.publish(row.topic, row.payload, qos=1)
                except NotConnectedError as exc:
                    self.stats.publish_failures += 1
                    log.warning(
                        "outbox.publish_deferred", error=str(exc), pending=self.outbox.depth
                    )
                    if self.link.connected.is_set():
                        # No PUBACK in time on a live link (a slow or stalled broker): try
                        # the same row again shortly; a redelivery is deduplicated by id+seq.
                        await asyncio.sleep(_RETRY_S)
                    else:
                        await self.link.wait_disconnected()
                    break
                await self.outbox.ack(row.id)
                self.stats.published += 1

    async def _status_loop(self) -> None:
        while True:
            await self.link.connected.wait()
            self._status_kick.clear()
            with contextlib.suppress(NotConnectedError):  # the next round publishes again
                await self.link.publish(self.topics.status, self.status_payload(), retain=True)
            # Every interval, and at once after a watchdog or supervisor decision.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._status_kick.wait(), self.cfg.mqtt.status_interval_s)

    def status_snapshot(self, state: str = "running") -> Status:
        """The sections' snapshots, validated once into the status model (agent.status):
        what `<prefix>/status`, `agentctl status` and `/metrics` render."""
        if state == "running" and self.llm is not None and self.llm.degraded:
            state = "degraded"  # keyword alerts only, until the engine is tried again
        analysis = self.analysis.snapshot() if self.analysis is not None else None
        active = self.tracker.active()
        snap = self.stats.snapshot(
            device_id=self.cfg.device_id,
            version=__version__,
            state=state,
            profile=self.cfg.profile,
            llm={
                "enabled": self.cfg.llm.enabled,
                **(self.llm.snapshot() if self.llm is not None else {}),
                **({"analysis": analysis} if analysis is not None else {}),
            },
            queue={"depth": len(self.queue), "max": self.queue.maxsize, "shed": self.queue.shed},
            outbox={
                "depth": self.outbox.depth,
                "shed": self.outbox.shed,
                "write_errors": self.outbox.write_errors,
                "max": self.cfg.outbox.max_events,
            },
            active_alerts=len(active),
            alerts_last_hour=self._alerts_last_hour(),
            watchdog={
                **(self.watchdog.snapshot() if self.watchdog is not None else {"level": None}),
                "events": self.events.recent(),
            },
        )
        snap["mqtt"]["acked"] = self.link.acked
        snap["mqtt"]["stale_acks"] = self.link.stale_acks
        for sid, n in Counter(a.stream_id for a in active).items():
            snap["streams"].setdefault(sid, {})["active_alerts"] = n
        if self.control is not None:
            snap["control"] = {
                "socket": str(self.control.path),
                "requests": self.control.requests,
                "refused": self.control.refused,
                "bad_requests": self.control.bad_requests,
                "follow_shed": self.control.follow_shed,
            }
        snap["fleet"] = self.fleet.snapshot() if self.fleet is not None else {"enabled": False}
        if self.asr is not None:
            snap["asr"] = {
                **self.asr.snapshot(),
                "published": self.asr_published,
                "publish_dropped": self.asr_publish_dropped,
            }
            for sid, queued in snap["asr"]["queue"]["per_stream_s"].items():
                snap["streams"].setdefault(sid, {})["asr_queue_s"] = queued
        else:
            snap["asr"] = {"state": "off"}
        if self.metrics is not None:
            snap["metrics"] = {
                "address": self.metrics.address,
                "scrapes": self.metrics.scrapes,
                "bad_requests": self.metrics.bad_requests,
            }
        if analysis is not None:  # each stream's window beside its ingest counters
            for sid, ctx in analysis.pop("streams").items():
                snap["streams"].setdefault(sid, {})["context"] = ctx
        return Status.model_validate(snap)

    def latency_histograms(self) -> list[Histogram]:
        """The latencies /metrics exports as histograms (the status shows their p50/p95)."""
        out = [
            Histogram(
                "segment_to_alert_seconds",
                "Segment received to its new alert committed to the outbox, by source.",
                window,
                {"source": source},
            )
            for source, window in self.stats.segment_to_alert.items()
        ]
        if self.asr is not None:
            out.append(
                Histogram(
                    "asr_seconds",
                    "Audio clip received to transcribed (queueing included).",
                    self.asr.latency,
                )
            )
        if self.analysis is not None:
            out.append(
                Histogram(
                    "analysis_seconds",
                    "One LLM analysis, request to answer.",
                    self.analysis.latency,
                )
            )
        if self.llm is not None:
            engine = self.llm.engine
            out += [
                Histogram("ttft_seconds", "Engine request to its first token.", engine.ttft),
                Histogram(
                    "time_per_output_token_seconds",
                    "Time per generated token after the first.",
                    engine.per_token,
                ),
            ]
        return out

    async def _on_control(self, req: dict[str, Any]) -> dict[str, Any]:
        """agentctl's requests (agent.control); the status is the same snapshot as MQTT's."""
        cmd = req["cmd"]
        if cmd == "status":
            return {"ok": True, "status": self.status_snapshot().document()}
        if cmd == "alerts":
            return {"ok": True, "active": [a.public() for a in self.tracker.active()]}
        if cmd == "config":
            return {"ok": True, "config": self.cfg.model_dump(mode="json")}
        if cmd == "engine.restart":
            if self.llm is None:
                return {"ok": False, "error": "no engine here (llm.enabled is false)"}
            if not self.llm.request_restart("operator"):
                return {"ok": False, "error": f"engine is {self.llm.state}: nothing to restart"}
            log.warning("control.engine_restart", rung=self.llm.rung.index)
            return {"ok": True, "state": self.llm.state}
        if cmd == "fleet":
            fleet = self.fleet.snapshot() if self.fleet is not None else {"enabled": False}
            return {"ok": True, "fleet": fleet}
        if cmd == "fault.pause_fleet_apply" and self.cfg.control.fault_injection:
            if self.fleet is None:
                return {"ok": False, "error": "fleet.enabled is false"}
            self.fleet.pause_before_apply_s = float(req.get("seconds", 0))
            return {"ok": True}
        if cmd == "fault.pause_detect" and self.cfg.control.fault_injection:
            # Segments are taken in and queued, but not detected (nor acknowledged) for the
            # given seconds: the window a SIGKILL must not lose anything in.
            self._detect_paused_until = time.monotonic() + float(req.get("seconds", 0))
            log.warning("control.fault_injection", detect_paused_s=req.get("seconds"))
            return {"ok": True}
        if cmd == "fault.block_loop" and self.cfg.control.fault_injection:
            seconds = float(req.get("seconds", 0))
            log.warning("control.fault_injection", blocked_s=seconds)
            # After the answer is written: the loop then hangs for real (time.sleep on it).
            asyncio.get_running_loop().call_later(0.2, time.sleep, seconds)
            return {"ok": True, "blocked_s": seconds}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    # -- systemd ----------------------------------------------------------------------------

    def _serving(self) -> bool:
        """READY: the broker connected and the engine settled (serving, refused, degraded,
        or not configured): a device that can only alert on keywords is still up."""
        if not self.link.connected.is_set():
            return False
        return self.llm is None or self.llm.state in ("running", "refused", "degraded")

    def status_line(self) -> str:
        """systemd's one-line STATUS=, e.g. "3 streams, engine ok, rung 0, 12 alerts today"."""
        if self.llm is None:
            engine = "engine off"
        else:
            state = self.llm.state
            engine = f"engine {'ok' if state == 'running' else state}, rung {self.llm.rung.index}"
        day, count = self._alerts_today
        alerts = count if day == time.strftime("%Y-%m-%d") else 0
        link = "" if self.link.connected.is_set() else ", MQTT down"
        return f"{len(self.stats.streams)} streams, {engine}, {alerts} alerts today{link}"

    async def _notify_loop(self) -> None:
        """READY once serving, STATUS when it changes, WATCHDOG at half of WatchdogSec while
        the loop runs (this task is on it) and the pipeline drains what is queued."""
        n = self.notifier
        period = min(n.ping_interval_s or 5.0, 5.0)
        ready = False
        last = None
        seen = self._processed
        next_ping = time.monotonic()
        while True:
            line = self.status_line()
            if not ready and self._serving():
                ready = True
                n.ready(line)
                log.info("agent.ready", status=line, systemd=n.enabled)
            elif ready and line != last:
                n.status(line)
            last = line
            if n.ping_interval_s is not None and time.monotonic() >= next_ping:
                next_ping = time.monotonic() + period
                waiting = len(self.queue) + self._taken - self._processed
                if waiting > 0 and self._processed == seen:
                    # Work waiting and none done for a whole period: let systemd decide.
                    log.error("agent.stalled", waiting=waiting, period_s=period)
                else:
                    n.watchdog()
                seen = self._processed
            # Until READY, look often: `systemctl start` waits on it (no lag after connect).
            await asyncio.sleep(period if ready else min(period, _READY_POLL_S))

    def _alerts_last_hour(self) -> int:
        cutoff = time.monotonic() - 3600
        while self._new_alerts and self._new_alerts[0] < cutoff:
            self._new_alerts.popleft()
        return len(self._new_alerts)

    def status_payload(self, state: str = "running") -> bytes:
        return self.status_snapshot(state).payload()

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, drain_timeout_s: float = 10.0) -> None:
        """Run until `stop` is set, then shut down without losing accepted data."""
        await self.outbox.open()
        restored = await self.outbox.active_alerts()
        self.tracker.restore(restored)
        await self._start_local_servers()
        log.info(
            "agent.starting",
            version=__version__,
            profile=self.cfg.profile,
            device_id=self.cfg.device_id,
            config=str(self.loaded.config_path),
            faults=len(self.cfg.faults),
            restored_alerts=len(restored),
            outbox_pending=self.outbox.depth,
        )
        try:
            async with TaskGroup() as tg:
                link_task = tg.create_task(self.link.run(), name="mqtt.link")
                detect = tg.create_task(self._detect_loop(), name="detect")
                publisher = tg.create_task(self._publish_loop(), name="outbox.publish")
                background = [
                    tg.create_task(self._tick_loop(), name="alerts.tick"),
                    tg.create_task(self._status_loop(), name="status"),
                    tg.create_task(self.errors.run(), name="errors"),
                ]
                background.append(tg.create_task(self._notify_loop(), name="systemd.notify"))
                if self.watchdog is not None:
                    background.append(tg.create_task(self.watchdog.run(), name="watchdog"))
                if self.asr is not None:
                    background += [
                        tg.create_task(self.asr.run(), name="asr"),
                        tg.create_task(self._asr_publish_loop(), name="asr.publish"),
                    ]
                if self.fleet is not None:
                    background.append(tg.create_task(self.fleet.run(), name="fleet"))
                self._tg = tg
                self._start_llm_tasks()
                await stop.wait()
                self.notifier.stopping()
                log.info("agent.stopping", queued=len(self.queue), outbox_pending=self.outbox.depth)
                await self._drain_input(drain_timeout_s)
                detect.cancel()
                # No fleet apply may rebuild the slow tier from here on: it would start an
                # engine nobody stops, and the task group would wait for it for ever.
                self._stopping = True
                for task in background:
                    if task.get_name() == "fleet":
                        task.cancel()
                        await asyncio.wait([task])
                # Before the final flush: an analysis cancelled later could land between
                # the tracker and the outbox and lose its event.
                await self._stop_llm_tasks(engine=False)
                async with self._processing:
                    await self._persist(self.tracker.flush())
                await self._drain_outbox(drain_timeout_s)
                publisher.cancel()
                with contextlib.suppress(NotConnectedError):
                    await self.link.publish(
                        self.topics.status, self.status_payload("stopped"), retain=True
                    )
                await self.link.announce_stopped()
                for task in background:
                    task.cancel()
                link_task.cancel()
            # Segments that arrived while we were disconnecting: process them, so their
            # alerts wait in the outbox for the next start.
            # (Their acknowledgements no longer reach the broker, which sends them again at
            # the next start: processed twice, alerted once.)
            while (item := self.queue.get_nowait()) is not None:
                await self.process(item.segment)
                item.done()
            async with self._processing:
                await self._persist(self.tracker.flush())
        finally:
            await self._close()

    def _start_llm_tasks(self) -> None:
        """The supervisor's and the analyzer's tasks, where they are built and not running."""
        assert self._tg is not None
        if self._stopping:
            return
        if self.llm is not None and self._sup_task is None:
            self._sup_task = self._tg.create_task(self.llm.run(), name="engine.supervisor")
        if self.analysis is not None and self._analysis_task is None:
            self._analysis_task = self._tg.create_task(self.analysis.run(), name="analysis")

    async def _stop_analysis(self) -> None:
        task, self._analysis_task = self._analysis_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # its end, without taking its CancelledError

    async def _stop_llm_tasks(self, *, engine: bool) -> None:
        """Cancel the analyzer's task, then the supervisor's; with `engine`, stop the
        engine too."""
        await self._stop_analysis()  # first: it calls the engine
        task, self._sup_task = self._sup_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        if engine:
            if self.llm is not None:
                await self.llm.stop()
            if self._codec is not None:
                self._codec.close()

    async def apply_config(self, loaded: LoadedConfig, *, engine: bool) -> None:
        """A new configuration, live (agent.fleet). The keyword tier's catalogue, stream
        settings and the watchdog's thresholds change between two segments; with `engine`,
        the slow tier is rebuilt on the new profile (the keyword tier runs throughout)."""
        cfg = loaded.config
        catalogue = cfg.faults != self.cfg.faults
        async with self._processing:  # no segment half through the old catalogue
            self.loaded, self.cfg = loaded, cfg
            self.detector = KeywordDetector(cfg.faults, cfg.keywords)
            for rule in cfg.faults:
                self.stats.alerts_by_fault.setdefault(rule.code, 0)
            if self.watchdog is not None:
                self.watchdog.reconfigure(cfg.watchdog)
            if self.asr is not None and catalogue:
                self.asr.set_catalogue(cfg.faults)  # the decoder's prompt names the faults
        if engine:
            await self._stop_llm_tasks(engine=True)
            self._build_llm()
            if self.watchdog is not None:
                self.watchdog.supervisor = self.llm
            self._start_llm_tasks()
        elif catalogue and self.analysis is not None:
            # The windows' heads describe the catalogue and the answer schema lists it: a
            # new analyzer over the same engine (the windows are prefilled again).
            await self._stop_analysis()
            self._build_analysis()
            self._start_llm_tasks()
        self._status_kick.set()

    # -- fleet (agent.fleet.manager.FleetHost) ------------------------------------------

    def health_begin(self) -> None:
        self._health_mark = self._processed
        self._health_errors = self.stats.detect_errors

    def health(self, *, engine: bool) -> Health:
        """The fleet's health gate, from its start (health_begin): MQTT connected, no
        detector errors, the pipeline making progress (segments waiting and none processed
        since the last look is a stall), and with the slow tier rebuilt, the engine
        serving."""
        if self.stats.detect_errors > self._health_errors:
            errors = self.stats.detect_errors - self._health_errors
            return Health(False, failed=f"{errors} segments failed detection since the apply")
        if not self.link.connected.is_set():
            return Health(False, waiting="MQTT not connected")
        waiting = len(self.queue) + self._taken - self._processed
        progressed = self._processed > self._health_mark
        self._health_mark = self._processed
        if waiting > 0 and not progressed:
            return Health(False, waiting=f"{waiting} segments waiting, none processed")
        if engine and self.cfg.llm.enabled:
            state = self.llm.state if self.llm is not None else "absent"
            detail = self.llm.detail if self.llm is not None else None
            if state in ("refused", "degraded", "absent"):
                return Health(False, failed=f"engine {state}: {detail}")
            if state != "running":
                return Health(False, waiting=f"engine {state}")
        return Health(True)

    def critical_analysis_running(self) -> bool:
        if self.analysis is None:
            return False
        critical = {a.stream_id for a in self.tracker.active() if a.severity == "critical"}
        return bool(critical & self.analysis.running_streams())

    async def _publish_ack(self, body: dict[str, Any]) -> None:
        """Retained, so a fleet tool sees each device's last answer whenever it looks."""
        payload = json.dumps(body, ensure_ascii=False).encode()
        with contextlib.suppress(NotConnectedError, asyncio.TimeoutError):
            await asyncio.wait_for(self.link.connected.wait(), _ACK_WAIT_S)
            await self.link.publish(self.topics.config_ack, payload, retain=True)
        self._status_kick.set()

    async def _close(self) -> None:
        """What run() holds, released whether it ended cleanly or not."""
        if self.llm is not None:
            await self.llm.stop()
        if self._codec is not None:
            self._codec.close()
        if self.control is not None:
            await self.control.close()
        if self.metrics is not None:
            await self.metrics.close()
        if self.asr is not None:
            self.asr.close()
        await self.outbox.close()
        log.info("agent.stopped", outbox_pending=self.outbox.depth)

    def _build_llm(self) -> None:
        """The slow tier for the current config: supervisor, tokenizer codec, analyzer (or
        none of them). Called at construction and when a fleet change restarts the engine."""
        cfg = self.cfg
        self.llm, self._codec, self.analysis = None, None, None
        if not (cfg.llm.enabled and cfg.engine is not None):
            return
        # Imports transformers (the tokenizer) only when used.
        from agent.analysis_link import EngineCodec

        # the loader resolves state_path; a config built in code gets the same default
        state = cfg.watchdog.state_path or cfg.outbox.path.parent / "watchdog.json"
        self.llm = EngineSupervisor(
            cfg.engine,
            cfg.watchdog,
            store=RungStore(state),
            events=self.events,
            context_tokens=cfg.llm.context_budget(cfg.engine),
            answer_tokens=cfg.llm.max_output_tokens,
            on_window=self._on_window,
        )
        self._codec = EngineCodec(self.llm)
        self._build_analysis()

    def _build_analysis(self) -> None:
        """The analyzer over the running supervisor, for the current catalogue."""
        from agent.analysis_link import EngineLlm

        cfg = self.cfg
        assert self.llm is not None and self._codec is not None and cfg.engine is not None
        self.analysis = Analyzer(
            EngineLlm(self.llm),
            self._codec,
            cfg.llm,
            cfg.faults,
            budget=cfg.llm.context_budget(cfg.engine),
            on_faults=self._on_llm_faults,
            priority=self._keyword_alert_streams,
            disabled_for=lambda sid: self.cfg.streams.for_stream(sid).disabled_faults,
        )

    def _local_servers(self) -> tuple[ControlServer | None, MetricsServer | None]:
        """agentctl's socket and /metrics, as configured (started by run())."""
        cfg = self.cfg
        control = metrics = None
        if cfg.control.enabled:
            path = cfg.control.socket_path or default_socket_path(cfg.outbox.path)
            control = ControlServer(path, self._on_control)
        if cfg.metrics.enabled:
            collector = SnapshotCollector(self.status_snapshot, self.latency_histograms)
            metrics = MetricsServer(cfg.metrics.host, cfg.metrics.port, collector)
        return control, metrics

    async def _start_local_servers(self) -> None:
        """The control socket and /metrics. Either failing (a path too long or unwritable,
        a port taken) is logged and the service runs without it: alerts come first."""
        if self.control is not None:
            try:
                await self.control.start()
            except OSError as exc:
                log.error("control.unavailable", path=str(self.control.path), error=str(exc))
                self.control = None
        if self.metrics is not None:
            try:
                await self.metrics.start()
            except OSError as exc:
                log.error(
                    "metrics.unavailable",
                    host=self.cfg.metrics.host,
                    port=self.cfg.metrics.port,
                    error=str(exc),
                )
                self.metrics = None

    async def _drain_input(self, limit_s: float) -> None:
        """Audio being transcribed first (its segments join the queue), then the queue."""
        deadline = time.monotonic() + limit_s

        def busy() -> bool:
            asr_busy = self.asr is not None and self.asr.state == "ready" and not self.asr.idle
            return bool(asr_busy or len(self.queue) or self._busy)

        while busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.asr is not None and not self.asr.idle:
            log.warning("asr.not_drained", **self.asr.snapshot()["queue"])

    async def _drain_outbox(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while self.outbox.depth and self.link.connected.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


def _fleet_store(cfg: AgentConfig) -> FleetStore | None:
    if not cfg.fleet.enabled:
        return None
    return FleetStore(cfg.fleet.state_dir or cfg.outbox.path.parent / "fleet")
