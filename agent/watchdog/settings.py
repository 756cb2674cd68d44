"""The `watchdog:` section: the memory watchdog's thresholds and leak detector, and the
supervisor's restart budget (agent.supervision.budget: restart_limit, restart_window_s,
backoff, degraded_retry_s) and rung file (state_path), under the names operators know.

Thresholds are per device (each profile sets its own): what counts as little headroom on an
8 GB Orin is plenty on a laptop GPU. Every threshold is on *headroom* (what is still free),
never on what is used, so one rule reads the same on unified memory and on a discrete GPU.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ByteSize, ConfigDict, Field, model_validator
from typing_extensions import Self

__all__ = ["WatchdogSettings"]


class WatchdogSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    enabled: bool = Field(
        True,
        title="Watchdog",
        description="Probe memory and engine health and act on them. Off: the engine is still "
        "restarted when it dies, but memory is not watched.",
    )
    interval_s: float = Field(
        1.0,
        gt=0,
        le=60,
        title="Probe interval",
        description="Seconds between memory probes and engine health checks.",
    )
    host_warn_bytes: ByteSize = Field(
        ByteSize(1 << 30),
        title="Host warn headroom",
        description="MemAvailable (not MemFree: page cache is reclaimable) below this: shed "
        "load (no new analyses; in-flight ones finish; keyword alerts go on).",
    )
    host_critical_bytes: ByteSize = Field(
        ByteSize(512 << 20),
        title="Host critical headroom",
        description="MemAvailable below this: restart the engine one rung down the ladder "
        "before the kernel's OOM killer picks a victim.",
    )
    gpu_warn_bytes: ByteSize | None = Field(
        None,
        title="GPU warn headroom",
        description="Discrete GPU only: free device memory (NVML) below this sheds load. "
        "None: the GPU is not probed (unified memory and CPU profiles).",
    )
    gpu_critical_bytes: ByteSize | None = Field(
        None,
        title="GPU critical headroom",
        description="Discrete GPU only: free device memory below this restarts the engine one "
        "rung down.",
    )
    psi_warn_some_avg10: float | None = Field(
        25.0,
        ge=0,
        le=100,
        title="Pressure warn (some, avg10 %)",
        description="Share of the last 10 s in which some task stalled on memory "
        "(/proc/pressure/memory). At or above it: warn, even with MemAvailable left (reclaim "
        "thrash). None: ignored.",
    )
    psi_critical_full_avg10: float | None = Field(
        40.0,
        ge=0,
        le=100,
        title="Pressure critical (full, avg10 %)",
        description="Share of the last 10 s in which every task stalled on memory. At or above "
        "it: critical. None: ignored.",
    )
    hysteresis: float = Field(
        0.2,
        ge=0,
        le=2,
        title="Hysteresis",
        description="A level is left only when headroom is this fraction above its threshold "
        "(and pressure this fraction below), so a value hovering at a threshold does not "
        "flap between shedding and serving.",
    )
    hang_s: float = Field(
        90.0,
        gt=0,
        title="Hang deadline",
        description="A request to the engine older than this is a hang: restart one rung down. "
        "Below llm.analysis_timeout_s, so the watchdog sees it before the analysis gives up.",
    )
    restart_limit: int = Field(
        3,
        ge=1,
        title="Restart limit",
        description="Engine restarts allowed within restart_window_s; one more puts the service "
        "in degraded (keyword-only) mode instead of a restart loop.",
    )
    restart_window_s: float = Field(
        600.0, gt=0, title="Restart window", description="Seconds the restart limit counts over."
    )
    degraded_retry_s: float = Field(
        900.0,
        gt=0,
        title="Degraded retry",
        description="Seconds in degraded mode before the engine is tried again.",
    )
    backoff_initial_s: float = Field(
        2.0,
        gt=0,
        title="Restart backoff start",
        description="First wait before a failed engine start is retried (exponential, jittered).",
    )
    backoff_max_s: float = Field(
        120.0, gt=0, title="Restart backoff cap", description="Longest wait between start retries."
    )
    stable_s: float = Field(
        86_400.0,
        gt=0,
        title="Stable period",
        description="Seconds on a lowered rung without trouble before one rung back up is tried.",
    )
    leak_window_s: float = Field(
        6 * 3600.0,
        gt=0,
        title="Leak window",
        description="Span of the service's resident memory samples the leak slope is fit over.",
    )
    leak_min_span_s: float = Field(
        3600.0,
        gt=0,
        title="Leak minimum span",
        description="No verdict on less than this much history (start-up growth is not a leak).",
    )
    leak_sample_s: float = Field(
        60.0, gt=0, title="Leak sample interval", description="Seconds between RSS samples."
    )
    leak_warn_bytes_per_hour: ByteSize = Field(
        ByteSize(32 << 20),
        title="Leak threshold",
        description="Slope of the service's RSS above this is reported as a suspected leak "
        "(32 MiB/h is 2.3 GiB over the 72 h target).",
    )
    state_path: Path | None = Field(
        None,
        title="State file",
        description="Where the ladder's rung and its reason persist (JSON). None: "
        "watchdog.json beside the outbox, in the state directory.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.host_critical_bytes >= self.host_warn_bytes:
            raise ValueError("host_critical_bytes must be below host_warn_bytes")
        if (self.gpu_warn_bytes is None) != (self.gpu_critical_bytes is None):
            raise ValueError("gpu_warn_bytes and gpu_critical_bytes go together")
        if (
            self.gpu_warn_bytes is not None
            and self.gpu_critical_bytes is not None
            and self.gpu_critical_bytes >= self.gpu_warn_bytes
        ):
            raise ValueError("gpu_critical_bytes must be below gpu_warn_bytes")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be at least backoff_initial_s")
        return self
