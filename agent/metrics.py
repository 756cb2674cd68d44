"""Prometheus `/metrics` on a loopback port: the status snapshot, rendered for scraping.

One source, three outputs: a scrape calls the same `StatusBuilder.snapshot()`
(agent.snapshot) that feeds `<prefix>/status` and `agentctl status`, and renders its model
(agent.status.Status) by attribute, so a renamed field fails type checking instead of
becoming a missing metric; the same `LatencyWindow`s whose percentiles the snapshot shows give
the histograms. Nothing here keeps a second set of counters that could drift from the status.

The endpoint is served by asyncio on the event loop (no exporter thread): a scrape reads
the daemon's state between two of its steps, so a snapshot is consistent without locks. It
answers `GET /metrics` (and `/`), HTTP/1.0 style: one request per connection, bounded
request size and time. Loopback by default: the numbers name streams and faults, and the
port has no authentication; scrape through the device's own Prometheus agent or a tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agent.status import (
    AlarmsStatus,
    AsrStatus,
    FleetStatus,
    LlmOff,
    LlmStatus,
    Status,
    StreamStatus,
    WatchdogStatus,
)
from pipelines.compat import timeout
from pipelines.latency import LatencyWindow

__all__ = ["Histogram", "MetricsServer", "SnapshotCollector", "families"]

log = structlog.get_logger(__name__)

_NS = "edge_agent"
_STATES = ("running", "degraded")  # always exported, 0 or 1, so alerts can use `== 1`
_ENGINE_STATES = ("running", "starting", "degraded", "refused", "stopped", "dead")
_LEVELS = {"ok": 0, "warn": 1, "critical": 2}
_MAX_REQUEST = 8192
_REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Histogram:
    """One latency histogram: a metric name (without namespace), help and labels."""

    name: str
    doc: str
    window: LatencyWindow
    labels: Mapping[str, str] = field(default_factory=dict)


def families(st: Status, histograms: Iterable[Histogram]) -> list[Metric]:
    """The metric families of one status snapshot (agent.status.Status)."""
    out = _Families()
    _service(out, st)
    _pipeline(out, st)
    if isinstance(st.asr, AsrStatus):
        _asr(out, st.asr)
    if isinstance(st.fleet, FleetStatus):
        for target, version in st.fleet.applied.items():
            out.gauge(
                "fleet_applied_version", "Fleet document version in force.", version, target=target
            )
    if isinstance(st.watchdog, WatchdogStatus):
        _memory(out, st.watchdog)
    _engine(out, st.llm)
    _streams(out, st.streams)
    control = st.control
    if control is not None:
        out.counter("control_requests", "Control socket requests.", control.requests)
        out.counter("control_refused", "Control connections refused.", control.refused)
        out.counter(
            "control_bad_requests",
            "Control requests refused as malformed (not JSON, too deep or long, too slow).",
            control.bad_requests,
        )
    for h in histograms:
        out.histogram(h)
    return out.done()


def _service(out: _Families, st: Status) -> None:
    """Identity, state and the broker connection."""
    out.gauge(
        "info",
        "Build and identity; always 1.",
        1,
        version=st.version,
        device_id=st.device_id,
        profile=st.profile,
    )
    for s in {*_STATES, st.state}:
        out.gauge("state", "1 for the service's current state.", int(s == st.state), state=s)
    out.gauge("uptime_seconds", "Seconds since the service started.", st.uptime_s)

    mqtt = st.mqtt
    out.gauge("mqtt_connected", "1 while connected to the broker.", int(mqtt.connected))
    out.counter("mqtt_connects", "Successful broker connections.", mqtt.connects)
    out.counter("mqtt_disconnects", "Broker connections lost.", mqtt.disconnects)
    out.counter(
        "mqtt_acked", "Input acknowledged to the broker once its effect was durable.", mqtt.acked
    )
    out.counter(
        "mqtt_stale_acks",
        "Acknowledgements not sent: their session had ended (the broker redelivers those).",
        mqtt.stale_acks,
    )


def _pipeline(out: _Families, st: Status) -> None:
    """Intake, the queue, detection, alerts and the outbox."""
    ingest = st.ingest
    out.counter("segments_received", "Transcript payloads received.", ingest.received)
    out.counter("segments_accepted", "Transcript segments accepted.", ingest.accepted)
    for reason, n in ingest.rejected.items():
        out.counter("segments_rejected", "Payloads rejected, by reason.", n, reason=reason)
    for reason, n in ingest.duplicates.items():
        out.counter("segments_duplicate", "Segments merged away as overlap.", n, reason=reason)

    queue = st.queue
    out.gauge("queue_depth", "Items waiting, by queue.", queue.depth, queue="ingest")
    out.gauge("queue_capacity", "Bound of each queue.", queue.max, queue="ingest")
    out.counter("queue_shed", "Items shed from a full queue.", queue.shed, queue="ingest")
    if queue.spool is not None:
        sp = queue.spool
        out.gauge("queue_depth", "Items waiting, by queue.", sp.depth, queue="ingest_spool")
        out.gauge("queue_capacity", "Bound of each queue.", sp.max, queue="ingest_spool")
        out.counter("queue_shed", "Items shed from a full queue.", sp.shed, queue="ingest_spool")
        out.counter(
            "spool_write_errors", "Ingest spool writes that failed and were retried.",
            sp.write_errors,
        )  # fmt: skip
    outbox = st.outbox
    out.gauge("outbox_depth", "Alert events not yet acknowledged by the broker.", outbox.depth)
    out.gauge("outbox_capacity", "Bound of the outbox.", outbox.max)
    out.counter("outbox_shed", "Alert events dropped from a full outbox.", outbox.shed)
    out.counter(
        "outbox_write_errors",
        "Outbox commits that failed and were retried (the input waits unacknowledged).",
        outbox.write_errors,
    )
    out.gauge(
        "outbox_salvaged_rows",
        "Rows carried from a damaged outbox file found at start (0: it was sound).",
        outbox.salvaged_rows,
    )

    detect = st.detect
    out.counter("keyword_matches", "Keyword-tier matches.", detect.keyword_matches)
    out.counter("llm_faults", "Faults the LLM reported and the checks accepted.", detect.llm_faults)
    out.counter("detect_errors", "Segments whose detection failed (a bug).", detect.errors)

    alerts = st.alerts
    for kind, n in alerts.events.items():
        out.counter("alert_events", "Alert lifecycle events, by type.", n, type=kind)
    for fault, n in alerts.by_fault.items():
        out.counter("alerts", "New alerts, by fault.", n, fault=fault)
    for verdict, n in alerts.verdicts.items():
        out.counter(
            "alert_verdicts",
            "Keyword alerts by the slow tier's verdict (unreviewed: ended without one).",
            n,
            verdict=verdict,
        )
    out.gauge("alerts_active", "Alerts currently active.", st.active_alerts)
    out.counter("alerts_published", "Alert events the broker acknowledged.", alerts.published)
    out.counter(
        "publish_failures", "Alert publishes not acknowledged in time.", alerts.publish_failures
    )
    for reason, n in alerts.publish_refused.items():
        out.counter(
            "publish_refused", "Alert publishes the broker refused, by reason.", n, reason=reason
        )
    out.counter("errors_reported", "Error events published.", st.errors.reported)
    out.counter("errors_suppressed", "Error events over the rate limit.", st.errors.suppressed)
    _alarms(out, st.alarms)


def _alarms(out: _Families, alarms: AlarmsStatus) -> None:
    for state, n in alarms.by_state.items():
        out.gauge("alarms", "Alarms on the list, by ISA-18.2 state.", n, state=state)
    out.counter(
        "alarms_dropped", "Standing alarms dropped past alarms.max_standing.", alarms.dropped
    )
    for action, n in alarms.applied.items():
        out.counter("alarm_commands", "Operator commands applied, by action.", n, action=action)
    for reason, n in alarms.refused.items():
        out.counter(
            "alarm_commands_refused", "Operator commands refused, by reason.", n, reason=reason
        )


def _asr(out: _Families, asr: AsrStatus) -> None:
    for s in {"loading", "ready", "unavailable", asr.state}:
        out.gauge("asr_state", "1 for the ASR stage's current state.", int(s == asr.state), state=s)
    out.counter("asr_payloads", "Audio payloads received.", asr.received)
    for reason, n in asr.rejected.items():
        out.counter("asr_rejected", "Audio payloads refused, by reason.", n, reason=reason)
    out.counter("asr_clips", "Clips transcribed (silent ones included).", asr.clips)
    out.counter("asr_silent_clips", "Clips where VAD found no speech.", asr.silent_clips)
    out.counter("asr_segments", "Transcript segments produced.", asr.segments)
    out.counter("asr_audio_seconds", "Seconds of audio transcribed.", asr.audio_s)
    out.gauge(
        "asr_real_time_factor",
        "Recognition time / audio time since start (under 1: keeps up).",
        asr.rtf,
    )
    q = asr.queue
    out.gauge("queue_depth", "Items waiting, by queue.", q.inbox, queue="asr_inbox")
    out.gauge("queue_capacity", "Bound of each queue.", q.inbox_max, queue="asr_inbox")
    out.counter("queue_shed", "Items shed from a full queue.", q.inbox_shed, queue="asr_inbox")
    out.counter("queue_shed", "Items shed from a full queue.", q.shed_clips, queue="asr_audio")
    out.gauge("asr_queue_seconds", "Seconds of audio waiting for the recogniser.", q.seconds)
    out.gauge("asr_queue_capacity_seconds", "The queue's bound in seconds of audio.", q.max_total_s)
    out.counter("asr_shed_seconds", "Seconds of audio shed from the full queue.", q.shed_s)
    for sid, seconds in q.per_stream_s.items():
        out.gauge(
            "stream_asr_queue_seconds", "Seconds of a stream's audio waiting.", seconds, stream=sid
        )


def _memory(out: _Families, wd: WatchdogStatus) -> None:
    if wd.level is not None:
        out.gauge("memory_level", "Watchdog level: 0 ok, 1 warn, 2 critical.", _LEVELS[wd.level])
    mem, limits = wd.memory, wd.thresholds
    for kind, avail, crit in (
        ("host", mem.mem_available if mem else None, limits.host_critical_bytes),
        ("gpu", mem.gpu_free if mem else None, limits.gpu_critical_bytes),
    ):
        out.gauge(
            "memory_available_bytes", "Available (host) or free (GPU) memory.", avail, memory=kind
        )
        out.gauge("memory_critical_bytes", "The watchdog's critical line.", crit, memory=kind)
        if avail is not None and crit is not None:
            out.gauge(
                "memory_headroom_bytes",
                "Available memory above the critical line (restart one rung down at 0).",
                avail - crit,
                memory=kind,
            )
    if mem is None:
        return
    out.gauge("memory_total_bytes", "Host memory.", mem.mem_total, memory="host")
    out.gauge("memory_total_bytes", "Host memory.", mem.gpu_total, memory="gpu")
    for kind, psi in (("some", mem.psi_some_avg10), ("full", mem.psi_full_avg10)):
        out.gauge("memory_pressure_avg10", "Memory PSI, 10 s average (%).", psi, kind=kind)
    for proc, rss in (("service", mem.service_rss), ("engine", mem.engine_rss)):
        out.gauge("process_rss_bytes", "Resident memory.", rss, process=proc)


def _engine(out: _Families, llm: LlmOff | LlmStatus) -> None:
    out.gauge("llm_enabled", "1 when the LLM tier is configured.", int(llm.enabled))
    if not isinstance(llm, LlmStatus):
        return
    for s in {*_ENGINE_STATES, llm.state}:
        out.gauge("engine_state", "1 for the engine's current state.", int(s == llm.state), state=s)
    model = llm.model
    if model is not None:
        out.gauge(
            "engine_model_info",
            "1 for the model the engine serves: its folder name, weights digest, base and "
            "merged adapter (empty when the base serves; adapter_error says why not).",
            1,
            model=model.name,
            sha256=model.weights_sha256 or "",
            base=model.base,
            adapter=model.adapter or "",
            adapter_error=model.adapter_error or "",
        )
    out.gauge(
        "engine_rung", "The watchdog ladder's rung (0: the profile as written).", llm.rung.index
    )
    for reason, n in llm.restarts_by_reason.items():
        out.counter("engine_restarts", "Engine restarts, by reason.", n, reason=reason)
    out.gauge(
        "engine_requests_in_flight", "Requests the engine is serving.", llm.requests_in_flight
    )
    eng = llm.engine
    out.gauge("engine_kv_cache_usage_ratio", "KV cache in use (0-1).", eng.kv_cache_usage)
    out.gauge(
        "engine_prefix_cache_hit_ratio",
        "Prefix-cache hits / queries, this engine run.",
        eng.prefix_cache_hit_rate,
    )
    out.gauge(
        "engine_spec_acceptance_ratio",
        "Speculative tokens accepted / drafted, this engine run.",
        eng.spec_acceptance_rate,
    )
    out.gauge(
        "engine_spec_mean_accepted_length",
        "Tokens a speculative verify step yields (1 + accepted / drafts), this engine run.",
        eng.spec_mean_accepted_length,
    )
    out.gauge(
        "engine_spec_k",
        "Speculative tokens per step (k) the engine runs, by method (mtp, draft, ngram, off).",
        eng.spec_k,
        method=eng.spec_method,
    )
    out.gauge("engine_waiting_requests", "Requests queued in the engine.", eng.num_waiting_reqs)
    analysis = llm.analysis
    if analysis is not None:
        out.counter("analyses", "LLM analyses completed.", analysis.analyses)
        out.gauge("analysis_waiting_streams", "Streams with unanalysed text.", analysis.waiting)
        out.gauge(
            "analysis_prefix_hit_ratio",
            "Prompt tokens served from the prefix cache.",
            analysis.prefix_hit_rate,
        )


def _streams(out: _Families, streams: Mapping[str, StreamStatus]) -> None:
    for sid, st in streams.items():
        out.counter("stream_segments", "Segments processed, by stream.", st.segments, stream=sid)
        out.gauge(
            "stream_last_segment_age_seconds",
            "Seconds since the stream's last segment.",
            st.last_segment_age_s,
            stream=sid,
        )
        out.gauge(
            "stream_active_alerts", "Active alerts, by stream.", st.active_alerts or 0, stream=sid
        )
        if st.context is not None:
            out.gauge(
                "stream_context_tokens",
                "Tokens in the stream's rolling window.",
                st.context.tokens,
                stream=sid,
            )


class _Families:
    """Collects samples into one family per name (Prometheus wants each name once)."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, value: float | None, **labels: str) -> None:
        self._add(GaugeMetricFamily, name, doc, value, labels)

    def counter(self, name: str, doc: str, value: float | None, **labels: str) -> None:
        self._add(CounterMetricFamily, name, doc, value, labels)

    def histogram(self, h: Histogram) -> None:
        full = f"{_NS}_{h.name}"
        fam = self._families.get(full)
        if fam is None:
            fam = HistogramMetricFamily(full, h.doc, labels=list(h.labels))
            self._families[full] = fam
        buckets = [(_le(bound), float(n)) for bound, n in h.window.cumulative()]
        assert isinstance(fam, HistogramMetricFamily)
        fam.add_metric(list(h.labels.values()), buckets, h.window.sum)

    def _add(
        self,
        kind: Callable[..., Metric],
        name: str,
        doc: str,
        value: float | None,
        labels: Mapping[str, str],
    ) -> None:
        if value is None:  # unknown (no sample yet, no GPU): absent, not zero
            return
        full = f"{_NS}_{name}"
        fam = self._families.get(full)
        if fam is None:
            fam = kind(full, doc, labels=list(labels))
            self._families[full] = fam
        fam.add_metric(list(labels.values()), float(value))  # type: ignore[attr-defined]

    def done(self) -> list[Metric]:
        return list(self._families.values())


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


class SnapshotCollector(Collector):
    """A prometheus_client collector over the daemon's snapshot and latency windows."""

    def __init__(
        self,
        snapshot: Callable[[], Status],
        histograms: Callable[[], Iterable[Histogram]],
    ) -> None:
        self._snapshot = snapshot
        self._histograms = histograms

    def collect(self) -> Iterator[Metric]:
        yield from families(self._snapshot(), self._histograms())


class MetricsServer:
    """`GET /metrics` on host:port, served on the event loop."""

    def __init__(self, host: str, port: int, collector: Collector) -> None:
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.scrapes = 0
        self.bad_requests = 0
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str | None:
        """host:port once listening (the real port when configured as 0)."""
        if self._server is None or not self._server.sockets:
            return None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=_MAX_REQUEST
        )
        log.info("metrics.listening", address=self.address)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with timeout(_REQUEST_TIMEOUT_S):  # reading, answering and the client's
                status, body, ctype = await self._answer(reader)  # reading of the answer
                head = (
                    f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self.bad_requests += 1  # a client that hung up or dawdled costs nothing more
        finally:
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with timeout(1.0):
                    await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, bytes, str]:
        head = await reader.readuntil(b"\r\n\r\n")  # over `limit`: LimitOverrunError
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or parts[0] != b"GET":
            self.bad_requests += 1
            return "405 Method Not Allowed", b"GET /metrics\n", "text/plain"
        path = parts[1].split(b"?", 1)[0]
        if path not in (b"/metrics", b"/"):
            self.bad_requests += 1
            return "404 Not Found", b"GET /metrics\n", "text/plain"
        self.scrapes += 1
        body = generate_latest(self.registry)
        return "200 OK", body, CONTENT_TYPE_LATEST
