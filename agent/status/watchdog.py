"""`status.watchdog`: the memory watchdog (agent.watchdog.monitor.MemoryWatchdog.snapshot)
and the recent events of the watchdog and the supervisor (agent.watchdog.events.EventLog).
With `watchdog.enabled: false` only `level` (null) and `events` (WatchdogOff)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from agent.status.base import StatusModel

__all__ = [
    "LeakStatus",
    "MemoryFigures",
    "MemoryThresholds",
    "WatchdogEvent",
    "WatchdogOff",
    "WatchdogStatus",
]

Level = Literal["ok", "warn", "critical"]


class WatchdogEvent(StatusModel):
    """One decision: `{"event", "at", ...fields}`; the names and fields of each event are
    listed in docs/watchdog.md. The only open model of the status: its fields are the
    event's own."""

    model_config = ConfigDict(extra="allow")

    event: str = Field(title="Event", description="e.g. `engine.restart`, `watchdog.level`.")
    at: float = Field(title="At", description="Epoch seconds.")


class MemoryFigures(StatusModel):
    """The last sample (agent.watchdog.probes.MemorySample): bytes, PSI in percent."""

    mem_total: int = Field(title="MemTotal", description="Host memory.")
    mem_available: int = Field(title="MemAvailable", description="Host memory available.")
    psi_some_avg10: float | None = Field(
        title="PSI some avg10", description="Memory pressure (some), 10 s; null without PSI."
    )
    psi_full_avg10: float | None = Field(
        title="PSI full avg10", description="Memory pressure (full), 10 s; null without PSI."
    )
    service_rss: int | None = Field(title="Service RSS", description="The service's RSS.")
    engine_rss: int | None = Field(
        title="Engine RSS", description="All child processes together (the engine core)."
    )
    gpu_free: int | None = Field(
        title="GPU free", description="Null unless a discrete GPU is probed."
    )
    gpu_total: int | None = Field(
        title="GPU total", description="Null unless a discrete GPU is probed."
    )


class MemoryThresholds(StatusModel):
    host_warn_bytes: int = Field(title="Host warn", description="MemAvailable warn line.")
    host_critical_bytes: int = Field(
        title="Host critical", description="MemAvailable critical line."
    )
    gpu_warn_bytes: int | None = Field(
        title="GPU warn", description="GPU free warn line; null when not probed."
    )
    gpu_critical_bytes: int | None = Field(
        title="GPU critical", description="GPU free critical line; null when not probed."
    )


class LeakStatus(StatusModel):
    slope_mib_per_hour: float | None = Field(
        title="Slope (MiB/h)", description="The service's RSS trend; null before enough history."
    )
    span_h: float = Field(title="Span (h)", description="History the slope is fitted over.")
    samples: int = Field(title="Samples", description="RSS samples in the window.")
    suspected: bool = Field(title="Suspected", description="The slope is over the warn rate.")


class WatchdogOff(StatusModel):
    level: None = Field(title="Level", description="Always null: no watchdog.")
    events: list[WatchdogEvent] = Field(
        title="Events", description="The last 20 supervisor events, oldest first."
    )


class WatchdogStatus(StatusModel):
    level: Level | None = Field(
        title="Level", description="`ok`, `warn`, `critical`; null before the first sample."
    )
    reasons: list[str] = Field(
        title="Reasons",
        description='The figures holding it above ok, e.g. "MemAvailable 0.39 GiB < 0.50 GiB".',
    )
    memory: MemoryFigures | None = Field(
        title="Memory", description="The last sample; null before the first."
    )
    thresholds: MemoryThresholds = Field(title="Thresholds", description="The lines in force.")
    samples: int = Field(title="Samples", description="Probes read.")
    probe_errors: int = Field(title="Probe errors", description="Probes that failed.")
    gpu_probe_error: str | None = Field(
        title="GPU probe error",
        description="Why a profile's GPU is not watched (e.g. NVML missing); null otherwise.",
    )
    psi_probe_error: str | None = Field(
        title="PSI probe error", description="Why the pressure figures are missing."
    )
    criticals: int = Field(
        title="Criticals", description="Critical reports the supervisor acted on."
    )
    leak: LeakStatus = Field(title="Leak", description="The leak detector's verdict.")
    events: list[WatchdogEvent] = Field(
        title="Events", description="The last 20 watchdog and supervisor events, oldest first."
    )
