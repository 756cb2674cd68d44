"""The memory watchdog: probe, judge, act.

Every `interval_s` it reads the probe (off the loop), runs the headroom policy and acts:
warn sheds load (the supervisor stops admitting new analyses; in-flight ones finish; the
keyword tier is never touched), critical restarts the engine one rung down (through the
supervisor, which rate-limits), back to ok resumes. Every `leak_sample_s` the service's own
RSS feeds the leak detector. Level changes and leak verdicts are events (log, status).

It acts through `Supervisor`, the protocol declared here, which the engine supervisor
(agent.supervision.EngineSupervisor) satisfies: this package never imports it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from agent.watchdog.events import EventLog, Severity
from agent.watchdog.leak import LeakDetector, LeakVerdict
from agent.watchdog.policy import Assessment, HeadroomPolicy, Level
from agent.watchdog.probes import MemoryProbe, MemorySample, ProbeError
from agent.watchdog.settings import WatchdogSettings

__all__ = ["MemoryWatchdog", "Supervisor"]

_SEVERITY: dict[Level, Severity] = {
    Level.ok: "info",
    Level.warn: "warning",
    Level.critical: "error",
}

log = structlog.get_logger(__name__)


class Supervisor(Protocol):
    """What the watchdog acts through: the engine supervisor (agent.supervision)."""

    @property
    def state(self) -> str:
        """The supervisor's state ("running" while the engine serves)."""

    def note_pressure(self) -> None:
        """Memory is tight (warn or critical): the stable period starts over."""

    def set_shedding(self, on: bool) -> None:
        """Warn level on or off: no new analyses while on."""

    def report_memory_critical(self, reasons: str) -> bool:
        """Critical level: restart one rung down; False when it was not taken."""


class MemoryWatchdog:
    def __init__(
        self,
        settings: WatchdogSettings,
        probe: MemoryProbe,
        *,
        events: EventLog,
        supervisor: Supervisor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.probe = probe
        self.events = events
        self.supervisor = supervisor
        self.policy = HeadroomPolicy(settings)
        self._clock = clock
        self.leak = LeakDetector(
            window_s=settings.leak_window_s,
            min_span_s=settings.leak_min_span_s,
            threshold_bytes_per_hour=float(settings.leak_warn_bytes_per_hour),
        )
        self.last: MemorySample | None = None
        self.assessment: Assessment | None = None
        self.samples = 0
        self.probe_errors = 0
        self.criticals = 0
        self._last_leak_sample: float | None = None
        self._leak_verdict = LeakVerdict(None, 0.0, 0, False)
        self._probe_error_logged: float | None = None
        self.changed = asyncio.Event()  # set after every sample (tests wait on it)

    def reconfigure(self, settings: WatchdogSettings) -> None:
        """New thresholds, live (a fleet config change needs no restart); the current level
        is kept and judged against them from the next sample on."""
        level = self.policy.level
        self.settings = settings
        self.policy = HeadroomPolicy(settings)
        self.policy.level = level
        self.events.record(
            "watchdog.reconfigured",
            "info",
            host_warn_bytes=int(settings.host_warn_bytes),
            host_critical_bytes=int(settings.host_critical_bytes),
        )

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # a bug here must not stop the service (keyword alerts)
                log.exception("watchdog.check_failed")
            await asyncio.sleep(self.settings.interval_s)

    async def check(self) -> Assessment | None:
        """One probe, one decision."""
        try:
            sample = await asyncio.to_thread(self.probe.read)
        except ProbeError as exc:
            self.probe_errors += 1
            now = self._clock()
            if self._probe_error_logged is None or now - self._probe_error_logged > 60:
                self._probe_error_logged = now
                self.events.record("watchdog.probe_failed", "error", error=str(exc))
            return None
        self.samples += 1
        self.last = sample
        assessment = self.policy.assess(sample)
        self.assessment = assessment
        self._act(assessment, sample)
        self._track_leak(sample)
        self.changed.set()
        return assessment

    def _act(self, a: Assessment, s: MemorySample) -> None:
        sup = self.supervisor
        if a.changed:
            self.events.record(
                "watchdog.level",
                _SEVERITY[a.level],
                level=a.level.name,
                previous=a.previous.name,
                reasons=list(a.reasons),
                mem_available=s.mem_available,
                psi_some_avg10=s.psi_some_avg10,
                psi_full_avg10=s.psi_full_avg10,
                gpu_free=s.gpu_free,
                action={
                    Level.ok: "resume analyses",
                    Level.warn: "pause new analyses",
                    Level.critical: "restart the engine one rung down",
                }[a.level],
            )
        if sup is None:
            return
        if a.level >= Level.warn:
            sup.note_pressure()
        if a.changed:
            sup.set_shedding(a.level >= Level.warn)
        # Again on every sample that is below the critical line while serving: after a
        # restart on a lower rung that still does not fit, the next rung (the supervisor
        # rate-limits). A sample only held at critical by the hysteresis margin does not
        # take another rung: the restart it caused may be what brought it back.
        if (
            a.entered is Level.critical
            and sup.state == "running"
            and sup.report_memory_critical("; ".join(a.reasons))
        ):
            self.criticals += 1

    def _track_leak(self, s: MemorySample) -> None:
        now = self._clock()
        if s.service_rss is None:
            return
        if self._last_leak_sample is not None and now - self._last_leak_sample < (
            self.settings.leak_sample_s
        ):
            return
        self._last_leak_sample = now
        self.leak.add(now, s.service_rss)
        verdict = self.leak.verdict()
        if verdict.suspected != self._leak_verdict.suspected:
            self.events.record(
                "watchdog.leak_suspected" if verdict.suspected else "watchdog.leak_cleared",
                "error" if verdict.suspected else "info",
                **verdict.as_dict(),
                service_rss=s.service_rss,
            )
        self._leak_verdict = verdict

    def snapshot(self) -> dict[str, Any]:
        a = self.assessment
        return {
            "level": a.level.name if a else None,
            "reasons": list(a.reasons) if a else [],
            "memory": self.last.as_dict() if self.last else None,
            "thresholds": {
                "host_warn_bytes": int(self.settings.host_warn_bytes),
                "host_critical_bytes": int(self.settings.host_critical_bytes),
                "gpu_warn_bytes": _int(self.settings.gpu_warn_bytes),
                "gpu_critical_bytes": _int(self.settings.gpu_critical_bytes),
            },
            "samples": self.samples,
            "probe_errors": self.probe_errors,
            "gpu_probe_error": getattr(self.probe, "gpu_error", None),
            "psi_probe_error": getattr(self.probe, "psi_error", None),
            "criticals": self.criticals,
            "leak": self._leak_verdict.as_dict(),
        }


def _int(value: int | None) -> int | None:
    return None if value is None else int(value)
