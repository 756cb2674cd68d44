"""The service's state, assembled from its parts: the status snapshot that the retained
`<prefix>/status` topic, `agentctl status` (the control socket) and `/metrics`
(agent.metrics) all render, the latency windows /metrics exports as histograms, and
systemd's readiness and one-line STATUS= (agent.notify).

`StatusBuilder` reads the parts through `Service`, the few attributes of the daemon it needs; it
changes nothing. The snapshot's keys are documented in docs/mqtt.md and docs/metrics.md.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from agent import __version__
from agent.alarm_inbox import AlarmInbox
from agent.config.models import AgentConfig
from agent.control import ControlServer
from agent.fleet.manager import FleetManager
from agent.intake import Intake
from agent.metrics import Histogram, MetricsServer
from agent.mqtt import MqttLink
from agent.outbox import Outbox
from agent.publish import AlertWriter, Transcripts
from agent.sparkplug.node import SparkplugNode
from agent.spool import Spool
from agent.stats import Stats
from agent.status import Status
from agent.supervision import EngineSupervisor
from agent.watchdog.events import EventLog
from agent.watchdog.monitor import MemoryWatchdog
from pipelines.analysis import Analyzer
from pipelines.keyword_stage import KeywordStage

__all__ = ["Service", "StatusBuilder"]


class Service(Protocol):
    """The parts of the running service the status reads (agent.daemon.Daemon)."""

    @property
    def cfg(self) -> AgentConfig: ...
    @property
    def stats(self) -> Stats: ...
    @property
    def link(self) -> MqttLink: ...
    @property
    def intake(self) -> Intake: ...
    @property
    def keywords(self) -> KeywordStage: ...
    @property
    def alarm_inbox(self) -> AlarmInbox: ...
    @property
    def sparkplug(self) -> SparkplugNode | None: ...
    @property
    def writer(self) -> AlertWriter: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def spool(self) -> Spool | None: ...
    @property
    def transcripts(self) -> Transcripts: ...
    @property
    def events(self) -> EventLog: ...
    @property
    def watchdog(self) -> MemoryWatchdog | None: ...
    @property
    def supervisor(self) -> EngineSupervisor | None: ...
    @property
    def analysis(self) -> Analyzer | None: ...
    @property
    def control(self) -> ControlServer | None: ...
    @property
    def metrics(self) -> MetricsServer | None: ...
    @property
    def fleet(self) -> FleetManager | None: ...


class StatusBuilder:
    """Assembles the status document (agent.status.Status) from the running parts."""

    def __init__(self, service: Service) -> None:
        self._s = service

    def snapshot(self, state: str = "running") -> Status:
        """The sections' snapshots, validated once into the status model (agent.status):
        what `<prefix>/status`, `agentctl status` and `/metrics` render."""
        s = self._s
        if state == "running" and s.supervisor is not None and s.supervisor.degraded:
            state = "degraded"  # keyword alerts only, until the engine is tried again
        analysis = s.analysis.snapshot() if s.analysis is not None else None
        active = s.keywords.tracker.active()
        queue = s.intake.queue
        snap = s.stats.snapshot(
            device_id=s.cfg.device_id,
            version=__version__,
            state=state,
            profile=s.cfg.profile,
            llm={
                "enabled": s.cfg.llm.enabled,
                **(s.supervisor.snapshot() if s.supervisor is not None else {}),
                **({"analysis": analysis} if analysis is not None else {}),
            },
            queue={
                "depth": len(queue),
                "max": queue.maxsize,
                "shed": queue.shed,
                "spool": _spool(s.spool, s.intake.spool_shed),
            },
            outbox={
                "depth": s.outbox.depth,
                "shed": s.outbox.shed,
                "write_errors": s.outbox.write_errors,
                "max": s.cfg.outbox.max_events,
                "damaged": s.outbox.salvage.line() if s.outbox.salvage else None,
                "salvaged_rows": s.outbox.salvage.saved() if s.outbox.salvage else 0,
            },
            active_alerts=len(active),
            alerts_last_hour=s.writer.alerts_last_hour(),
            watchdog={
                **(s.watchdog.snapshot() if s.watchdog is not None else {"level": None}),
                "events": s.events.recent(),
            },
        )
        snap["mqtt"]["acked"] = s.link.acked
        snap["mqtt"]["stale_acks"] = s.link.stale_acks
        snap["mqtt"]["broker"] = s.link.broker
        snap["mqtt"]["last_error"] = s.link.last_error
        snap["mqtt"]["disconnected_s"] = s.link.disconnected_s()
        for sid, n in Counter(a.stream_id for a in active).items():
            snap["streams"].setdefault(sid, {})["active_alerts"] = n
        if s.control is not None:
            snap["control"] = {
                "socket": str(s.control.path),
                "requests": s.control.requests,
                "refused": s.control.refused,
                "bad_requests": s.control.bad_requests,
                "follow_shed": s.control.follow_shed,
            }
        snap["alarms"] = s.alarm_inbox.snapshot()
        snap["sparkplug"] = s.sparkplug.snapshot() if s.sparkplug is not None else None
        snap["fleet"] = s.fleet.snapshot() if s.fleet is not None else {"enabled": False}
        asr = s.intake.asr
        if asr is not None:
            snap["asr"] = {
                **asr.snapshot(),
                "published": s.transcripts.published,
                "publish_dropped": s.transcripts.dropped,
            }
            for sid, queued in snap["asr"]["queue"]["per_stream_s"].items():
                snap["streams"].setdefault(sid, {})["asr_queue_s"] = queued
        else:
            snap["asr"] = {"state": "off"}
        if s.metrics is not None:
            snap["metrics"] = {
                "address": s.metrics.address,
                "scrapes": s.metrics.scrapes,
                "bad_requests": s.metrics.bad_requests,
            }
        if analysis is not None:  # each stream's window beside its ingest counters
            for sid, ctx in analysis.pop("streams").items():
                snap["streams"].setdefault(sid, {})["context"] = ctx
        return Status.model_validate(snap)

    def payload(self, state: str = "running") -> bytes:
        """The snapshot as the retained status message."""
        return self.snapshot(state).payload()

    def histograms(self) -> list[Histogram]:
        """The latencies /metrics exports as histograms (the status shows their p50/p95)."""
        s = self._s
        out = [
            Histogram(
                "segment_to_alert_seconds",
                "Segment received to its new alert committed to the outbox, by source.",
                window,
                {"source": source},
            )
            for source, window in s.stats.segment_to_alert.items()
        ]
        out.append(
            Histogram(
                "time_to_verdict_seconds",
                "A keyword alert's new event to the slow tier's verdict on it.",
                s.stats.time_to_verdict,
            )
        )
        if s.intake.asr is not None:
            out.append(
                Histogram(
                    "asr_seconds",
                    "Audio clip received to transcribed (queueing included).",
                    s.intake.asr.latency,
                )
            )
        if s.analysis is not None:
            out.append(
                Histogram(
                    "analysis_seconds",
                    "One LLM analysis, request to answer.",
                    s.analysis.latency,
                )
            )
        if s.supervisor is not None:
            engine = s.supervisor.engine
            out += [
                Histogram("ttft_seconds", "Engine request to its first token.", engine.ttft),
                Histogram(
                    "time_per_output_token_seconds",
                    "Time per generated token after the first.",
                    engine.per_token,
                ),
            ]
        return out

    def serving(self) -> bool:
        """READY: the broker connected and the engine settled (serving, refused, degraded,
        or not configured): a device that can only alert on keywords is still up."""
        s = self._s
        if not s.link.connected.is_set():
            return False
        return s.supervisor is None or s.supervisor.state in ("running", "refused", "degraded")

    def line(self) -> str:
        """systemd's one-line STATUS=, e.g. "3 streams, engine ok, rung 0, 12 alerts today"."""
        s = self._s
        if s.supervisor is None:
            engine = "engine off"
        else:
            state = s.supervisor.state
            engine = (
                f"engine {'ok' if state == 'running' else state}, rung {s.supervisor.rung.index}"
            )
        link = "" if s.link.connected.is_set() else ", MQTT down"
        alerts = s.writer.alerts_today()
        return f"{len(s.stats.streams)} streams, {engine}, {alerts} alerts today{link}"


def _spool(spool: Spool | None, shed: int) -> dict[str, Any] | None:
    if spool is None:
        return None
    return {
        "depth": spool.depth,
        "max": spool.max_segments,
        "written": spool.written,
        "taken": spool.taken,
        "shed": shed,
        "write_errors": spool.write_errors,
        "damaged": spool.salvage.line() if spool.salvage else None,
    }
