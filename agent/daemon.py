"""The daemon: builds the service, runs it (one TaskGroup of named tasks) and stops it in the
order that loses nothing.

The path of a transcript segment is two files: agent/intake.py (MQTT in, the bounded queue,
settling the input once its effect is durable) and pipelines/keyword_stage.py (overlap
merge, keyword detection, the alert tracker; its events committed through the
`AlertSink`). Audio clips join it in the intake (through the ASR stage, pipelines.asr); the
slow tier (pipelines.analysis) takes each merged segment from the stage (`SlowTier`) and
gives its accepted faults back to it (`KeywordStage.observe_llm`). The way out is
agent/publish.py (the outbox, then MQTT), the status is assembled in agent/snapshot.py,
agentctl's commands are agent/commands.py, systemd's notify loop is in agent/notify.py.

Tasks: the broker link, the intake's loop into the keyword stage (`detect`), the tracker
tick, the outbox publisher, the error reporter, the status publisher, systemd's notify loop
and the memory watchdog; with audio, the ASR stage and our transcripts' publisher; with the
fleet, its manager; with the LLM, the engine supervisor (start, restarts, the tuning
ladder: agent.supervision) and the analysis workers (pipelines.analysis), which never hold
up the keyword tier. Stopping drains in the order that loses nothing: finish the queued
segments, flush pending updates into the outbox, give the outbox a grace period to empty
(what remains stays on disk for the next start), announce `stopped`, disconnect, then
persist anything that arrived meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from agent import __version__
from agent.alarm_inbox import AlarmInbox
from agent.commands import Commands
from agent.config.loader import LoadedConfig, default_socket_path, resolve_mqtt_password
from agent.config.models import AgentConfig
from agent.control import ControlServer
from agent.errors_report import ErrorReporter
from agent.fleet.health import HealthGate
from agent.fleet.manager import FleetManager, Health, effective_config, fleet_filters
from agent.fleet.planning import plan_refusal
from agent.fleet.store import FleetStore
from agent.intake import Intake
from agent.metrics import MetricsServer, SnapshotCollector
from agent.mqtt import MqttLink, Topics
from agent.notify import SystemdNotifier, notify_loop
from agent.outbox import Outbox
from agent.publish import AlertWriter, Publisher, Transcripts
from agent.reader import keyword_detector
from agent.snapshot import StatusBuilder
from agent.sparkplug.node import NodeIdentity, SparkplugNode
from agent.sparkplug.payloads import FaultInfo
from agent.spool import Spool
from agent.stats import Stats
from agent.supervision import EngineSupervisor
from agent.supervision.cores import CoreRecord, children, reap_engine_children
from agent.supervision.store import RungStore
from agent.watchdog.events import EventLog
from agent.watchdog.monitor import MemoryWatchdog
from agent.watchdog.probes import HostProbe, MemoryProbe, NvmlGpu
from pipelines.alerts import Reviewer
from pipelines.analysis import Analyzer
from pipelines.compat import TaskGroup, cancel_until_done
from pipelines.keyword_stage import KeywordStage

if TYPE_CHECKING:
    from agent.analysis_link import EngineCodec
    from pipelines.evidence import AcceptedFault

__all__ = ["Daemon"]

log = structlog.get_logger(__name__)


class Daemon:
    def __init__(self, loaded: LoadedConfig, *, probe: MemoryProbe | None = None) -> None:
        """`probe` replaces the real memory probe (tests feed measured sequences)."""
        local, store = loaded, _fleet_store(loaded.config)
        if store is not None:  # the last known good fleet layers over the local file
            loaded = effective_config(local, store)
        self.loaded = loaded
        for issue in loaded.deprecations:
            log.warning(
                "config.deprecated",
                key=issue.path,
                source=issue.source,
                line=issue.line,
                reason=issue.reason,
            )
        cfg = loaded.config
        self.cfg = cfg
        self.topics = Topics(cfg.mqtt.topic_prefix)
        self.stats = Stats()
        for rule in cfg.faults:  # every fault exported from the start, at 0 (docs/metrics.md)
            self.stats.alerts_by_fault[rule.code] = 0
        self.outbox = Outbox(cfg.outbox.path, cfg.outbox.max_events)
        self.status = StatusBuilder(self)
        self.commands = Commands(self)
        self.control, self.metrics = self._local_servers()
        # The segment path: intake -> keyword stage -> writer (the outbox) -> publisher.
        self.writer = AlertWriter(
            self.outbox, self.topics, self.stats, lambda: self.cfg.device_id, self.control
        )
        self.keywords = KeywordStage(
            keyword_detector(cfg.faults, cfg.keywords),
            lambda sid: self.cfg.streams.for_stream(sid),  # noqa: PLW0108 (cfg changes)
            self.writer,
            self.stats,
            shelving=lambda: self.cfg.alarms.shelving(),  # noqa: PLW0108 (cfg changes)
            max_standing=lambda: self.cfg.alarms.max_standing,
        )
        self.errors = ErrorReporter(self.topics.errors, cfg.mqtt.errors_per_minute, self.stats)
        self.transcripts = Transcripts()  # ours, for other consumers (asr.publish_transcript)
        self.spool = (
            Spool(
                cfg.ingest.spool_path or cfg.outbox.path.parent / "spool.sqlite",
                cfg.ingest.spool_max_segments,
            )
            if cfg.ingest.spool_max_segments
            else None
        )
        # Operators' ack / shelve / unshelve (docs/alarms.md), applied through the stage.
        self.alarm_inbox = AlarmInbox(
            self.topics.prefix, lambda: self.cfg.alarms, self.keywords, self.errors
        )
        self.intake = Intake(
            lambda: self.cfg,
            self.topics,
            self.stats,
            errors=self.errors,
            stage=self.keywords,
            transcripts=self.transcripts,
            spool=self.spool,
            alarms=self.alarm_inbox if cfg.alarms.commands else None,
        )
        self.link = MqttLink(
            cfg.mqtt,
            resolve_mqtt_password(cfg.mqtt),
            self.topics,
            self.intake.on_message,
            self.stats,
            audio=cfg.asr.enabled,
            extra_filters=[
                *(fleet_filters(cfg.fleet, cfg.device_id) if store is not None else ()),
                *(self.alarm_inbox.filters if cfg.alarms.commands else ()),
            ],
            on_error=self.intake.on_message_error,
            receive_maximum=cfg.ingest.queue_size,  # the broker never overfills the queue
        )
        self.publisher = Publisher(
            self.link,
            self.topics,
            self.outbox,
            self.stats,
            status=self.status.payload,
            status_interval_s=lambda: self.cfg.mqtt.status_interval_s,
            errors=self.errors,
        )
        self.events = EventLog(on_event=self.publisher.kick.set)
        # Sparkplug B (docs/sparkplug.md): each delivered alert event on to the edge node.
        self.sparkplug: SparkplugNode | None = None
        if cfg.sparkplug.enabled:
            self.sparkplug = self._sparkplug_node()
            self.publisher.sink = self.sparkplug.offer
        self.supervisor: EngineSupervisor | None = None
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
                supervisor=self.supervisor,
            )
        self.fleet: FleetManager | None = None
        if store is not None:
            self.fleet = FleetManager(
                self, local, store, self.publisher.publish_ack, plan_check=plan_refusal
            )
            self.intake.fleet = self.fleet  # its documents arrive on the broker link
        self._health = HealthGate(self)
        self._stopping = False  # no slow tier is (re)started once shutdown began
        self.notifier = SystemdNotifier()
        self._tg: TaskGroup | None = None
        self._sup_task: asyncio.Task[None] | None = None
        self._analysis_task: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, drain_timeout_s: float = 10.0) -> None:
        """Run until `stop` is set, then shut down without losing accepted data."""
        await self._open_stores()
        restored = await self.outbox.active_alerts()
        self.keywords.restore(restored, await self.outbox.standing_alarms())
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
        asr = self.intake.asr
        try:
            async with TaskGroup() as tg:
                link_task = tg.create_task(self.link.run(), name="mqtt.link")
                detect = tg.create_task(self.intake.run(), name="detect")
                publisher = tg.create_task(self.publisher.run_outbox(), name="outbox.publish")
                background = [
                    tg.create_task(self.keywords.run(), name="alerts.tick"),
                    tg.create_task(self.alarm_inbox.run(), name="alarms.commands"),
                    tg.create_task(self.publisher.run_status(), name="status"),
                    tg.create_task(self.errors.run(self.link), name="errors"),
                ]
                background.append(
                    tg.create_task(
                        notify_loop(self.notifier, self.status, self.intake),
                        name="systemd.notify",
                    )
                )
                if self.watchdog is not None:
                    background.append(tg.create_task(self.watchdog.run(), name="watchdog"))
                if self.spool is not None:
                    background.append(tg.create_task(self.spool.run_writer(), name="spool"))
                if asr is not None:
                    background += [
                        tg.create_task(asr.run(), name="asr"),
                        tg.create_task(self.transcripts.run(self.link), name="asr.publish"),
                    ]
                if self.fleet is not None:
                    background.append(tg.create_task(self.fleet.run(), name="fleet"))
                background += self._start_sparkplug(tg)
                self._tg = tg
                self._start_llm_tasks()
                await stop.wait()
                self.notifier.stopping()
                log.info(
                    "agent.stopping",
                    queued=len(self.intake.queue),
                    outbox_pending=self.outbox.depth,
                )
                await self.intake.drain(drain_timeout_s)
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
                await self.keywords.flush()
                await self.publisher.drain_outbox(drain_timeout_s)
                publisher.cancel()
                await self.publisher.publish_status("stopped")
                await self.link.announce_stopped()
                await self._stop_sparkplug()
                for task in background:
                    task.cancel()
                # Again until each ends: a cancellation swallowed by asyncio.wait_for before
                # 3.12 (aiomqtt's PUBACK wait, in every publishing task and the link) would
                # leave that task, and so the service, running.
                for task in [*background, link_task]:
                    await cancel_until_done(task)
            # Segments that arrived while we were disconnecting: process them, so their
            # alerts wait in the outbox for the next start.
            # (Their acknowledgements no longer reach the broker, which sends them again at
            # the next start: processed twice, alerted once.)
            await self.intake.process_queued()
            await self.keywords.flush()
        finally:
            await self._close()

    async def _open_stores(self) -> None:
        """The outbox and the spool; a damaged file moved aside is said loudly (the log,
        `<prefix>/errors`, the status)."""
        await self.outbox.open()
        if self.spool is not None:
            await self.spool.open()
        for name, salvage in (
            ("outbox", self.outbox.salvage),
            ("spool", self.spool.salvage if self.spool is not None else None),
        ):
            if salvage is not None:  # started on a fresh file
                log.error(f"{name}.damaged", detail=salvage.line(), moved_to=str(salvage.moved_to))
                self.errors.report(str(salvage.path), f"{name}_damaged", 0, salvage.line())

    def _start_llm_tasks(self) -> None:
        """The supervisor's and the analyzer's tasks, where they are built and not running."""
        assert self._tg is not None
        if self._stopping:
            return
        if self.supervisor is not None and self._sup_task is None:
            self._sup_task = self._tg.create_task(self.supervisor.run(), name="engine.supervisor")
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
            if self.supervisor is not None:
                await self.supervisor.stop()
            if self._codec is not None:
                self._codec.close()

    async def _close(self) -> None:
        """What run() holds, released whether it ended cleanly or not."""
        if self.supervisor is not None:
            await self.supervisor.stop()
        if self._codec is not None:
            self._codec.close()
        if self.control is not None:
            await self.control.close()
        if self.metrics is not None:
            await self.metrics.close()
        if self.intake.asr is not None:
            self.intake.asr.close()
        await self.outbox.close()
        if self.spool is not None:
            await self.spool.close()
        # Nothing the service started outlives it: an engine core still running now (a
        # shutdown that did not join it) is killed, and the line says what was left.
        left = await asyncio.to_thread(reap_engine_children)
        if left:
            log.error("agent.children_reaped", pids=left)
        log.info("agent.stopped", outbox_pending=self.outbox.depth,
                 children_alive=await asyncio.to_thread(children))  # fmt: skip

    async def apply_config(self, loaded: LoadedConfig, *, engine: bool) -> None:
        """A new configuration, live (agent.fleet). The keyword tier's catalogue, stream
        settings and the watchdog's thresholds change between two segments; with `engine`,
        the slow tier is rebuilt on the new profile (the keyword tier runs throughout)."""
        cfg = loaded.config
        catalogue = cfg.faults != self.cfg.faults
        asr = self.intake.asr
        # Built before anything changes (its reader file is read here, off the loop): if it
        # cannot be, the apply fails whole and the running config stays.
        detector = await asyncio.to_thread(keyword_detector, cfg.faults, cfg.keywords)
        async with self.keywords.lock:  # no segment half through the old catalogue
            self.loaded, self.cfg = loaded, cfg
            self.keywords.detector = detector
            for rule in cfg.faults:
                self.stats.alerts_by_fault.setdefault(rule.code, 0)
            if self.watchdog is not None:
                self.watchdog.reconfigure(cfg.watchdog)
            if asr is not None and catalogue:
                asr.set_catalogue(cfg.faults)  # the decoder's prompt names the faults
        if engine:
            await self._stop_llm_tasks(engine=True)
            self._build_llm()
            if self.watchdog is not None:
                self.watchdog.supervisor = self.supervisor
            self._start_llm_tasks()
        elif catalogue and self.analysis is not None:
            # The windows' heads describe the catalogue and the answer schema lists it: a
            # new analyzer over the same engine (the windows are prefilled again).
            await self._stop_analysis()
            self._build_analysis()
            self._start_llm_tasks()
        self.publisher.kick.set()

    # -- fleet (agent.fleet.manager.FleetService; the gate: agent.fleet.health) -----------

    def health_begin(self) -> None:
        self._health.begin()

    def health(self, *, engine: bool) -> Health:
        return self._health.check(engine=engine)

    def critical_analysis_running(self) -> bool:
        return self._health.critical_analysis_running()

    # -- construction -------------------------------------------------------------------

    def _build_llm(self) -> None:
        """The slow tier for the current config: supervisor, tokenizer codec, analyzer (or
        none of them). Called at construction and when a fleet change restarts the engine."""
        cfg = self.cfg
        self.supervisor, self._codec, self.analysis = None, None, None
        self.keywords.slow = None
        if not (cfg.llm.enabled and cfg.engine is not None):
            return
        # Imports transformers (the tokenizer) only when used.
        from agent.analysis_link import EngineCodec

        # the loader resolves state_path; a config built in code gets the same default
        state = cfg.watchdog.state_path or cfg.outbox.path.parent / "watchdog.json"
        self.supervisor = EngineSupervisor(
            cfg.engine,
            cfg.watchdog,
            store=RungStore(state),
            cores=CoreRecord(state.parent / "engine-cores.json"),
            events=self.events,
            context_tokens=cfg.llm.context_budget(cfg.engine),
            answer_tokens=cfg.llm.max_output_tokens,
            on_window=self._on_window,
        )
        self._codec = EngineCodec(self.supervisor)
        self._build_analysis()

    def _on_window(self, tokens: int) -> None:
        """The watchdog's context rung (or its climb back) resizes every stream's window."""
        if self.analysis is not None:
            self.analysis.set_budget(tokens)

    async def _llm_faults(self, stream_id: str, faults: Sequence[AcceptedFault]) -> None:
        """The slow tier's faults to the tracker, signed by the model the engine serves."""
        model = self.supervisor.engine.model if self.supervisor is not None else None
        reviewer = None if model is None else Reviewer(model.name, model.weights_sha256)
        await self.keywords.observe_llm(stream_id, faults, reviewer)

    def _build_analysis(self) -> None:
        """The analyzer over the running supervisor, for the current catalogue."""
        from agent.analysis_link import EngineLlm

        cfg = self.cfg
        assert self.supervisor is not None and self._codec is not None and cfg.engine is not None
        self.analysis = Analyzer(
            EngineLlm(self.supervisor),
            self._codec,
            cfg.llm,
            cfg.faults,
            budget=cfg.llm.context_budget(cfg.engine),
            on_faults=self._llm_faults,  # the slow tier's faults: the same tracker
            priority=self.keywords.keyword_alert_streams,
            disabled_for=lambda sid: self.cfg.streams.for_stream(sid).disabled_faults,
        )
        self.keywords.slow = self.analysis  # each merged segment goes on to it

    def _start_sparkplug(self, tg: TaskGroup) -> list[asyncio.Task[None]]:
        """The Sparkplug node's task (none when disabled); its first births show the
        alarms on the list (restored from the outbox)."""
        if self.sparkplug is None:
            return []
        self.sparkplug.seed(a.public() for a in self.keywords.alarms.listed())
        return [tg.create_task(self.sparkplug.run(), name="sparkplug")]

    async def _stop_sparkplug(self) -> None:
        """The node's last changes (bounded), then its NDEATH."""
        if self.sparkplug is not None:
            await self.sparkplug.drain(2.0)
            await self.sparkplug.stop()

    def _sparkplug_node(self) -> SparkplugNode:
        cfg = self.cfg

        def faults() -> list[FaultInfo]:  # the catalogue now (a fleet apply may change it)
            return [
                FaultInfo(r.code, r.labels.get("en", r.code), str(r.severity.value))
                for r in self.cfg.faults
            ]

        return SparkplugNode(
            NodeIdentity.of(cfg.sparkplug, cfg.mqtt, cfg.device_id),
            cfg.mqtt,
            resolve_mqtt_password(cfg.mqtt),
            state_path=cfg.outbox.path.parent / "sparkplug.json",
            faults=faults,
            properties={"Software": f"edge-agent {__version__}", "Device Id": cfg.device_id},
            queue_size=cfg.sparkplug.queue_size,
        )

    def _local_servers(self) -> tuple[ControlServer | None, MetricsServer | None]:
        """agentctl's socket and /metrics, as configured (started by run())."""
        cfg = self.cfg
        control = metrics = None
        if cfg.control.enabled:
            path = cfg.control.socket_path or default_socket_path(cfg.outbox.path)
            control = ControlServer(path, self.commands.handle)
        if cfg.metrics.enabled:
            collector = SnapshotCollector(self.status.snapshot, self.status.histograms)
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


def _fleet_store(cfg: AgentConfig) -> FleetStore | None:
    if not cfg.fleet.enabled:
        return None
    return FleetStore(cfg.fleet.state_dir or cfg.outbox.path.parent / "fleet")
