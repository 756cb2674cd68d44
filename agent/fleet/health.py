"""The fleet's health gate over the running service (the daemon's side of
`FleetService.health`): MQTT connected, no detector errors since the apply, the pipeline making
progress, and with the slow tier rebuilt, the engine serving. Also whether a critical
alert's analysis is running (an engine change waits for it)."""

from __future__ import annotations

from typing import Protocol

from agent.config.models import AgentConfig
from agent.fleet.manager import Health
from agent.intake import Intake
from agent.mqtt import MqttLink
from agent.stats import Stats
from agent.supervision import EngineSupervisor
from pipelines.analysis import Analyzer
from pipelines.keyword_stage import KeywordStage

__all__ = ["HealthGate", "Service"]


class Service(Protocol):
    """The parts of the running service the gate reads (agent.daemon.Daemon)."""

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
    def supervisor(self) -> EngineSupervisor | None: ...
    @property
    def analysis(self) -> Analyzer | None: ...


class HealthGate:
    def __init__(self, service: Service) -> None:
        self._s = service
        # Segments processed at the last look, detector errors at the gate's start.
        self._mark = self._errors = 0

    def begin(self) -> None:
        self._mark = self._s.intake.processed
        self._errors = self._s.stats.detect_errors

    def check(self, *, engine: bool) -> Health:
        """From `begin()` on: segments waiting and none processed since the last look is a
        stall; `engine`: the slow tier was rebuilt, so the engine must serve."""
        s = self._s
        if s.stats.detect_errors > self._errors:
            errors = s.stats.detect_errors - self._errors
            return Health(False, failed=f"{errors} segments failed detection since the apply")
        if not s.link.connected.is_set():
            return Health(False, waiting="MQTT not connected")
        waiting = s.intake.waiting()
        processed = s.intake.processed
        progressed = processed > self._mark
        self._mark = processed
        if waiting > 0 and not progressed:
            return Health(False, waiting=f"{waiting} segments waiting, none processed")
        if engine and s.cfg.llm.enabled:
            state = s.supervisor.state if s.supervisor is not None else "absent"
            detail = s.supervisor.detail if s.supervisor is not None else None
            if state in ("refused", "degraded", "absent"):
                return Health(False, failed=f"engine {state}: {detail}")
            if state != "running":
                return Health(False, waiting=f"engine {state}")
        return Health(True)

    def critical_analysis_running(self) -> bool:
        s = self._s
        if s.analysis is None:
            return False
        critical = {a.stream_id for a in s.keywords.tracker.active() if a.severity == "critical"}
        return bool(critical & s.analysis.running_streams())
